"""A URL's mount (the daemon reads the headers after the fork) serves files/, metadata.json
and the tree's listing without numpy on the way: a model with converted views has numpy
imported in the background once the mount serves, before anyone asks
(docs/internals/copylimit.md: numpy was most of a mount's imports, and of the time to a first byte)."""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np

from tests.mount.test_first_numpy import numpy_in
from tests.support import daemon_pid


def test_a_url_mount_serves_its_first_bytes_without_numpy(nginx, corpus, rmount):
    model = corpus.models["mixed"]
    rmnt = rmount(f"{nginx.url}/files/mixed/mixed.gguf")
    pid = daemon_pid(rmnt)
    with open(rmnt / "files" / "mixed.gguf", "rb") as f:
        assert f.read(4096) == model.local.read_bytes()[:4096]
    json.loads((rmnt / "metadata.json").read_text())
    listing = subprocess.run(["ls", "-lR", rmnt], capture_output=True, text=True, check=True)
    assert ".npy" in listing.stdout
    assert np.array_equal(np.load(rmnt / "a" / "f32" / "weight.npy"),
                          model.expected["a.f32.weight"].values)
    deadline = time.monotonic() + 30            # imported in the background once serving
    while not numpy_in(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert numpy_in(pid), "numpy not imported in the background"
    bf16 = model.expected["c.bf16.weight"]
    assert np.array_equal(np.load(rmnt / (bf16.path + ".npy")), bf16.values)
