"""The test helpers' own promises (tests/support): what they make is accepted where the
suite runs, a fresh Debian 13 included, so that a failure there is tensorfs's and not a
helper's."""

from __future__ import annotations

import os
import subprocess

from tests.support.tls import authority_and_server, needs_openssl
from tests.support.users import private_namespace_problem


@needs_openssl
def test_the_private_ca_passes_strict_verification(tmp_path):
    """Python 3.13 verifies with VERIFY_X509_STRICT, which refuses a CA without keyUsage
    (Debian 13's Python failed the Hub-endpoint test on that); ``openssl verify
    -x509_strict`` applies the same rules to the chain the TLS tests serve."""
    certificate = authority_and_server(tmp_path / "ca")
    result = subprocess.run(["openssl", "verify", "-x509_strict", "-CAfile", str(certificate.trust),
                             str(certificate.cert)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_private_mount_namespace_is_said_as_a_chroot_says_it(tmp_path, monkeypatch):
    """In a chroot ``unshare -m --propagation private`` fails (its / is no mount point):
    the probe every namespace test asks first says so, rather than the test failing."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "unshare").write_text("#!/bin/sh\necho 'unshare: cannot change root filesystem "
                                  "propagation: Invalid argument' >&2\nexit 1\n")
    (fake / "unshare").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    problem = private_namespace_problem()
    assert problem is not None and "cannot change root filesystem propagation" in problem
