"""A secret never reaches argv, /proc/PID/cmdline, ``list``, the log, an error line,
metadata.json or the fsname, however it was spelled (issue 21, docs/reference/inputs.md
"Credentials"): a token in a URL's user name, a user:password, a query, and a
--storage-option value given under any abbreviation argparse accepts."""

from __future__ import annotations

import json

import pytest

from tests.support import daemon_pid, run_tensorfs, usage_error

TOKEN = "TOKENtensorfs0123456789abcdef"
PASSWORD = "PWtensorfs0123456789abcdef"
API_KEY = "APIKEYtensorfs0123456789abcdef"
MODEL = "files/safetensors/model.safetensors"


def _url(nginx, userinfo: str = "", query: str = "") -> str:
    host = nginx.url.split("://", 1)[1]
    return f"http://{userinfo}{host}/{MODEL}{query}"


def _places(mnt, log, pid) -> dict[str, str]:
    places = {"metadata.json": (mnt / "metadata.json").read_text(), "log": log.read_text(),
              "list": run_tensorfs("list").stdout, "list --json": run_tensorfs("list", "--json").stdout}
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        places["cmdline"] = f.read().replace(b"\0", b" ").decode(errors="replace")
    with open("/proc/self/mountinfo") as f:
        places["mountinfo"] = "".join(line for line in f if str(mnt) in line)
    return places


SPELLINGS = [
    ("token as user name", lambda n: [_url(n, f"{TOKEN}@")]),
    ("user:password", lambda n: [_url(n, f"user:{PASSWORD}@")]),
    ("token as user, empty password", lambda n: [_url(n, f"{TOKEN}:@")]),
    ("signed query", lambda n: [_url(n, query=f"?X-Sig={TOKEN}")]),
    ("--stor abbreviation", lambda n: [_url(n), "--stor", f'headers={{"X-Api-Key": "{API_KEY}"}}']),
    ("--storage-opt=", lambda n: [_url(n), f'--storage-opt=headers={{"X-Api-Key": "{API_KEY}"}}']),
    ("--storage-option=", lambda n: [_url(n), f'--storage-option=headers={{"X-Api-Key": "{API_KEY}"}}']),
    ("a plain string value", lambda n: [_url(n), "--storage-option", f"client_kwargs={API_KEY}x"]),
]


MOUNTED = SPELLINGS[:-1]         # the last is refused (client_kwargs is a dict): below


@pytest.mark.parametrize("case,argv", MOUNTED, ids=[c for c, _ in MOUNTED])
def test_no_spelling_of_a_secret_is_shown(nginx, rmount, tmp_path, case, argv):
    args = argv(nginx)
    log = tmp_path / "daemon.log"
    mnt = rmount(*args, "--log", log)
    places = _places(mnt, log, daemon_pid(mnt))
    for where, text in places.items():
        for secret in (TOKEN, PASSWORD, API_KEY):
            assert secret not in text, (where, text)
    row = json.loads(places["list --json"])
    # as named, without credentials; a query shown as "?…" (docs/reference/cli.md "list")
    shown = f"{nginx.url}/{MODEL}" + ("?…" if "?" in args[0] else "")
    assert any(r["source"] == shown for r in row), row


@pytest.mark.parametrize("case,argv", SPELLINGS, ids=[c for c, _ in SPELLINGS])
def test_no_spelling_of_a_secret_reaches_an_error_line(nginx, remote_env, case, argv):
    args = argv(nginx)
    args[0] = args[0].replace(MODEL, "files/safetensors/missing.safetensors")
    result = run_tensorfs("inspect", *args, env=remote_env)
    assert result.returncode != 0
    if result.returncode == 2:
        usage_error(result)                # a usage line (no argument in it), the error line
    else:
        assert len(result.stderr.splitlines()) == 1, result.stderr
    for secret in (TOKEN, PASSWORD, API_KEY):
        assert secret not in result.stderr, result.stderr


@pytest.mark.parametrize("argv", [["--stor-opt", f"headers={API_KEY}"],
                                  [f"--storage-optoin=headers={API_KEY}"],
                                  [f"--storage-option=headers={API_KEY}", "extra",
                                   f"http://{TOKEN}@x/"]],
                         ids=["unknown flag", "misspelled=", "extra arguments"])
def test_a_usage_error_does_not_echo_a_secret(argv):
    result = run_tensorfs("inspect", "http://127.0.0.1:9/x.safetensors", *argv)
    assert result.returncode == 2
    assert API_KEY not in result.stderr and TOKEN not in result.stderr, result.stderr
