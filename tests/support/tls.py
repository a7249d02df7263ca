"""Certificates for the TLS tests, made with the ``openssl`` command as a user makes them.

- ``authority_and_server``: a CA (keyUsage keyCertSign) and a server certificate for
  127.0.0.1 it signs (v3, CA:FALSE, keyUsage, subjectAltName IP:127.0.0.1): what every TLS
  client accepts once the CA is trusted, Python 3.13's strict verification included;
- ``self_signed``: one certificate that is its own issuer, as ``openssl req -x509`` makes it
  (CA:TRUE: OpenSSL's default) or with ``extra`` extensions (``basicConstraints=critical,
  CA:FALSE`` makes one rustls takes).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None,
                                   reason="needs the openssl command to make certificates")


@dataclass
class Certificate:
    cert: Path          # the server's certificate (PEM)
    key: Path           # its key (PEM)
    trust: Path         # what a client must trust: the CA's PEM (the certificate itself if self-signed)


def openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)


def authority_and_server(directory: Path, host_san: str = "IP:127.0.0.1") -> Certificate:
    directory.mkdir(parents=True, exist_ok=True)
    # keyUsage on both, and the key identifiers: Python 3.13's strict X.509 verification
    # (VERIFY_X509_STRICT, huggingface_hub's client) refuses a CA certificate without them
    openssl(directory, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=tensorfs test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-addext", "subjectKeyIdentifier=hash", "-keyout", "ca.key", "-out", "ca.pem")
    openssl(directory, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "server.key", "-out", "server.csr")
    (directory / "server.ext").write_text(f"subjectAltName={host_san}\n"
                                          "basicConstraints=CA:FALSE\n"
                                          "keyUsage=critical,digitalSignature,keyEncipherment\n"
                                          "extendedKeyUsage=serverAuth\n"
                                          "subjectKeyIdentifier=hash\n"
                                          "authorityKeyIdentifier=keyid,issuer\n")
    openssl(directory, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.pem")
    return Certificate(directory / "server.pem", directory / "server.key", directory / "ca.pem")


def self_signed(directory: Path, *extra: str) -> Certificate:
    """``openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=localhost -addext
    subjectAltName=IP:127.0.0.1,DNS:localhost`` and ``-addext`` each of ``extra``."""
    directory.mkdir(parents=True, exist_ok=True)
    adds = [a for e in ("subjectAltName=IP:127.0.0.1,DNS:localhost", *extra) for a in ("-addext", e)]
    openssl(directory, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=localhost", *adds, "-keyout", "self.key", "-out", "self.pem")
    return Certificate(directory / "self.pem", directory / "self.key", directory / "self.pem")


def hashed_directory(directory: Path, *pems: Path) -> Path:
    """A directory in OpenSSL's hashed layout (``openssl rehash``): what SSL_CERT_DIR names."""
    directory.mkdir(parents=True, exist_ok=True)
    for pem in pems:
        shutil.copyfile(pem, directory / pem.name)
    openssl(directory, "rehash", ".")
    return directory
