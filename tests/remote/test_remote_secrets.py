"""A credential never appears (docs/reference/remote.md): not in metadata.json, the daemon's log, an error
line, the daemon's arguments (/proc/PID/cmdline) or the mount's fsname (/proc/self/mountinfo,
what findmnt shows).  Three kinds: HF_TOKEN for a gated repo, a user:password and a signed
query in an http URL, an S3 secret given with --storage-option."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import run_tensorfs
from tests.support.reliability_models import daemon_pid
from tests.support.remote_checks import HF_TOKEN, assert_matches_reference, doc_of
from tests.support.servers import BASIC_PASSWORD, BASIC_USER

SIGNATURE = "SIGtensorfs0123456789abcdef"
S3_SECRET = "S3SECRETtensorfs/abcdEFGH+ijkl"


def _everywhere(mnt: Path, log: Path, pid: int) -> dict[str, str]:
    """Every place a credential must not be, as text."""
    places = {"metadata.json": (mnt / "metadata.json").read_text(), "log": log.read_text()}
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        places["cmdline"] = f.read().replace(b"\0", b" ").decode(errors="replace")
    with open("/proc/self/mountinfo") as f:
        places["mountinfo"] = "".join(line for line in f if str(mnt) in line)
    findmnt = subprocess.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", str(mnt)],
                             capture_output=True, text=True)
    places["findmnt"] = findmnt.stdout
    places["list"] = run_tensorfs("list").stdout
    return places


def _read_everything(mnt: Path) -> None:
    for entry in doc_of(mnt)["tensors"].values():
        (mnt / entry["path"]).read_bytes()


def _assert_nowhere(secret: str, places: dict[str, str]) -> None:
    leaks = [name for name, text in places.items() if secret in text]
    assert leaks == [], f"the credential appears in: {', '.join(leaks)}"


def test_hf_token_appears_nowhere(rmount, corpus, tmp_path):
    log = tmp_path / "daemon.log"
    mnt = rmount("hf://tfs/gated/model.safetensors", "--log", log, "--debug",
                 env={"HF_TOKEN": HF_TOKEN})
    _read_everything(mnt)
    assert_matches_reference(mnt, corpus.models["safetensors"].files)
    _assert_nowhere(HF_TOKEN, _everywhere(mnt, log, daemon_pid(mnt)))


@pytest.mark.receivers
def test_a_password_and_a_signature_in_a_url_appear_nowhere(nginx, corpus, rmount, tmp_path):
    host = nginx.url.removeprefix("http://")
    url = (f"http://{BASIC_USER}:{BASIC_PASSWORD}@{host}/basic/mixed/mixed.gguf"
           f"?X-Amz-Signature={SIGNATURE}")
    log = tmp_path / "daemon.log"
    mnt = rmount(url, "--log", log, "--debug")
    model = corpus.models["mixed"]
    assert_matches_reference(mnt, model.files, model.expected)
    assert doc_of(mnt)["source"] == f"http://{host}/basic/mixed/mixed.gguf"
    places = _everywhere(mnt, log, daemon_pid(mnt))
    _assert_nowhere(BASIC_PASSWORD, places)
    _assert_nowhere(SIGNATURE, places)


def test_a_wrong_password_is_refused_without_showing_it(nginx, remote_env, tmp_path):
    host = nginx.url.removeprefix("http://")
    url = f"http://{BASIC_USER}:wrong-{BASIC_PASSWORD}@{host}/basic/mixed/mixed.gguf"
    result = run_tensorfs("inspect", url, env=remote_env)
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1 and "401" in result.stderr, result.stderr
    assert BASIC_PASSWORD not in result.stderr


def test_a_storage_option_secret_appears_nowhere(s3, corpus, rmount, remote_env, tmp_path):
    env = {k: v for k, v in remote_env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    log = tmp_path / "daemon.log"
    mnt = rmount("s3://models/sharded/model.safetensors.index.json", "--log", log, "--debug",
                 "--storage-option", "key=testing", "--storage-option", f"secret={S3_SECRET}",
                 env={"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None})
    model = corpus.models["sharded"]
    assert_matches_reference(mnt, model.files)
    _assert_nowhere(S3_SECRET, _everywhere(mnt, log, daemon_pid(mnt)))
    # and in a refusal
    result = run_tensorfs("inspect", "s3://models/nope.gguf", "--storage-option", "key=testing",
                          "--storage-option", f"secret={S3_SECRET}", env=env)
    assert result.returncode == 1 and S3_SECRET not in result.stderr + result.stdout
