"""``tensorfs.open(URL)`` (docs/reference/api.md, docs/reference/remote.md):
the same metadata, tensors, bytes and arrays as
``tensorfs.open`` of the local files with the same bytes, over plain HTTP, hf:// and s3://
against the test servers.  Each check runs in a fresh interpreter with the environment a
user would set (huggingface_hub reads HF_ENDPOINT when it is imported)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.remote_checks import url_of

CHECK = r"""
import sys
import numpy as np
import tensorfs

url, local = sys.argv[1], sys.argv[2]
with tensorfs.open(url) as r, tensorfs.open(local) as l:
    assert dict(r.metadata) == dict(l.metadata)
    assert r.metadata_types == l.metadata_types
    assert list(r.tensors) == list(l.tensors)
    for name, info in l.tensors.items():
        theirs = r.tensors[name]
        assert (theirs.dtype, theirs.shape, theirs.offset, theirs.nbytes) == \
               (info.dtype, info.shape, info.offset, info.nbytes), name
        assert r.read(name) == l.read(name), name
        assert r.read(name, offset=1, size=5) == l.read(name, offset=1, size=5), name
        try:
            want = l.array(name)
        except tensorfs.ModelError:
            continue
        got = r.array(name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert not isinstance(got, np.memmap) and not got.flags.writeable or got.dtype == np.float32
        assert np.array_equal(np.ascontiguousarray(got).view(np.uint8),
                              np.ascontiguousarray(want).view(np.uint8)), name
print("ok", len(l.tensors))
"""


@pytest.mark.parametrize("key", ["safetensors", "mixed", "sharded", "split"])
@pytest.mark.parametrize("transport", ["http", "hf", "s3"])
def test_open_of_a_url_is_open_of_the_local_file(transport, key, nginx, s3, corpus, remote_env):
    model = corpus.models[key]
    url = url_of(transport, nginx, key, model.entry)
    result = subprocess.run([sys.executable, "-c", CHECK, url, str(model.local)],
                            capture_output=True, text=True, env=remote_env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")


def test_a_missing_url_is_a_model_error(nginx, remote_env):
    code = ("import sys, tensorfs\n"
            "try:\n    tensorfs.open(sys.argv[1])\n"
            "except tensorfs.ModelError as e:\n    print(e)\nelse:\n    sys.exit(3)\n")
    result = subprocess.run([sys.executable, "-c", code, f"{nginx.url}/files/none/x.gguf"],
                            capture_output=True, text=True, env=remote_env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "404" in result.stdout or "not found" in result.stdout
