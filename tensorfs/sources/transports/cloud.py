"""Object stores through obstore: ``s3://BUCKET/KEY`` (``s3a://`` too), ``gs://`` and
``az://`` (``tensorfs.sources.transports.objects``).

- The endpoint and credentials are read as obstore reads them (``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
  ``AWS_ENDPOINT_URL``; ``GOOGLE_*``; ``AZURE_*``), and ``AWS_ENDPOINT_URL_S3`` as botocore
  does; ``--storage-option`` takes obstore's config keys and s3fs's names for the common
  ones (``key``, ``secret``, ``token``, ``endpoint_url``, ``anon``, ``client_kwargs``'s
  ``region_name``/``endpoint_url``).  Plain http only to an ``http://`` endpoint.
- Pinning: the first answer's version id (a versioned bucket) or else its ETag; every read
  names the version id and sends ``If-Match`` with the ETag, and every answer's ETag,
  version id, Last-Modified and Content-Range total must be the first answer's
  (``base.check_answer``).  ``s3://B/K?versionId=V``
  mounts version V.
- A directory is a prefix: listed with a delimiter.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qs, unquote, urlsplit

from tensorfs.errors import ModelError
from tensorfs.sources.location import DIRECTORY, FILE
from tensorfs.sources.transports.base import PROBE_BYTES, FetchError, Pin, Transport
from tensorfs.sources.transports.objects import (
    NO_RETRIES,
    check_meta,
    client_options,
    get_exact,
    head,
    listing,
    modified_of,
    obstore,
    serve_here,
    store_problem,
    store_spec,
    trusted_roots,
)
from tensorfs.sources.urls import display_url

SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")
STORE = {"s3": "S3Store", "s3a": "S3Store", "gs": "GCSStore", "gcs": "GCSStore",
         "az": "AzureStore", "abfs": "AzureStore", "abfss": "AzureStore"}
# s3fs's names for the options most often given, as obstore calls them
S3FS_NAMES = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token",
              "endpoint_url": "endpoint", "region_name": "region", "anon": "skip_signature",
              "requester_pays": "request_payer"}
# obstore's client options (ClientConfig) a user may give with --storage-option: the client's,
# not the store's (the TLS trust of a private endpoint, a proxy)
CLIENT_KEYS = ("root_certificate", "proxy_url", "proxy_ca_certificate", "proxy_excludes",
               "allow_invalid_certificates", "user_agent")


class CloudTransport(Transport):
    etag_checked = True

    def serve(self):
        serve_here()

    def reopen(self):
        """Nothing here belongs to one process: a store is made where it is first used."""

    def _connect(self) -> None:
        obstore(self.url)
        parts = urlsplit(self.url)
        self.scheme = parts.scheme.lower()
        self.kind_name = STORE[self.scheme]
        shown = display_url(self.url)
        query = parse_qs(parts.query, keep_blank_values=True)
        self._pinned: dict[str, str] = {}
        if query:
            versions = query.pop("versionId", None)
            if query or self.kind_name != "S3Store" or versions is None or len(versions) != 1 \
                    or not versions[0]:
                raise ModelError("remote_url", "the only query an object URL may have is "
                                 "s3://BUCKET/KEY?versionId=VERSION", file=shown)
            self._pinned[shown] = versions[0]
        self._versions: dict[str, str | None] = {}
        self._stores: dict[str, tuple] = {}
        self.config, self.allow_http = self._config(dict(self.settings.storage_options))

    def _config(self, options: dict) -> tuple[dict, bool]:
        extra_client = {}
        client = options.pop("client_kwargs", None) or {}
        if not isinstance(client, dict):
            raise ModelError("remote_options", "client_kwargs must be a JSON object",
                             file=display_url(self.url))
        options.update({k: v for k, v in client.items() if k in ("region_name", "endpoint_url")})
        for key in ("headers",):
            if key in options:
                extra_client["default_headers"] = options.pop(key)
        extra_client.update(trusted_roots({k: options.pop(k) for k in CLIENT_KEYS if k in options},
                                          display_url(self.url)))
        config = {}
        for key, value in options.items():
            key = S3FS_NAMES.get(key, key) if self.kind_name == "S3Store" else key
            config[key] = value
        endpoint = ""
        if self.kind_name == "S3Store":
            endpoint = str(config.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3")
                           or os.environ.get("AWS_ENDPOINT_URL") or "")
            if endpoint:
                config["endpoint"] = endpoint
            if config.get("skip_signature") is True:
                config["skip_signature"] = True
        self._client_extra = extra_client
        return config, endpoint.lower().startswith("http://")

    def _bucket_key(self, path: str) -> tuple[str, str]:
        parts = urlsplit(path)
        return parts.netloc.rpartition("@")[2], unquote(parts.path.lstrip("/"))

    def _store(self, bucket: str) -> tuple:
        spec = self._stores.get(bucket)
        if spec is None:
            try:
                spec = store_spec(self.kind_name, bucket, config=self.config or None,
                                  retry_config=NO_RETRIES,
                                  client_options=client_options(self.settings,
                                                                allow_http=self.allow_http,
                                                                extra=self._client_extra))
            except FetchError:
                raise
            except Exception as error:      # any exception: obstore's configuration errors
                raise ModelError("remote_options", f"cannot use this URL: {store_problem(error)}",
                                 file=display_url(self.url)) from None
            self._stores[bucket] = spec
        return spec

    def identity(self, path):
        bucket, key = self._bucket_key(path)
        endpoint = self.config.get("endpoint") or f"{self.scheme}:{self.config.get('region', '')}"
        return f"{self.scheme}+{endpoint}/{bucket}/{key}"

    def _where(self) -> str:
        return urlsplit(str(self.config.get("endpoint") or "")).netloc or self.scheme

    def probe(self, path, timeout):
        bucket, key = self._bucket_key(path)
        if not key:
            raise FetchError("not_a_file", "is a bucket, not an object")
        store = self._store(bucket)
        pinned = self._pinned.get(path)
        try:
            body, meta = get_exact(store, key, 0, PROBE_BYTES, timeout=timeout, version=pinned,
                                   probe=True, where=self._where())
        except FetchError as error:
            if error.status != 416:
                raise
            meta = head(store, key, timeout=timeout, where=self._where())   # an empty object
            if meta["size"] != 0:
                raise
            body = b""
        version_id = _version_id(meta.get("version") or pinned)
        self._versions[path] = version_id
        etag = meta.get("e_tag")
        modified = meta.get("last_modified")
        pin = Pin(meta["size"], version_id or etag, etag=etag, modified=modified_of(meta))
        return pin, body, modified.timestamp() if modified is not None else None

    def fetch(self, path, start, end, pin, timeout, cancel=None):
        if end <= start:
            return b""
        bucket, key = self._bucket_key(path)
        version_id = self._versions.get(path)
        body, meta = get_exact(self._store(bucket), key, start, end, timeout=timeout,
                               if_match=pin.etag, version=version_id,
                               where=self._where(), cancel=cancel)
        check_meta(pin, meta, version=_version_id(meta.get("version")) if version_id else None)
        return body

    def kind(self, path):
        bucket, key = self._bucket_key(path)
        if not key:
            return DIRECTORY
        store = self._store(bucket)
        if path in self._pinned:
            return FILE
        try:
            head(store, key, timeout=self.settings.timeout, where=self._where())
            return FILE
        except FetchError as error:
            if error.kind != "not_found":
                raise
        found = listing(store, key.rstrip("/") + "/", timeout=self.settings.timeout,
                        where=self._where())
        return DIRECTORY if found.get("objects") or found.get("common_prefixes") else None

    def files(self, directory):
        bucket, key = self._bucket_key(directory)
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        found = listing(self._store(bucket), prefix, timeout=self.settings.timeout,
                        where=self._where())
        names = (str(meta["path"]).rsplit("/", 1)[-1] for meta in found.get("objects", []))
        return sorted(n for n in names if n and not n.startswith("."))

    def sizes(self, directory):
        bucket, key = self._bucket_key(directory)
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        found = listing(self._store(bucket), prefix, timeout=self.settings.timeout,
                        where=self._where())
        sizes = {}
        for meta in found.get("objects", []):
            name, size = str(meta["path"]).rsplit("/", 1)[-1], meta.get("size")
            if name and type(size) is int and size >= 0:
                sizes[name] = size
        return sizes


def _version_id(value) -> str | None:
    """An object's version id, or None (an unversioned bucket's "null")."""
    return value if isinstance(value, str) and value not in ("", "null") else None
