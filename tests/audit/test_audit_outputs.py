"""Outputs a user names (``--log FILE``) are never written through another user's link or
into another user's file, and never block on a FIFO nobody reads: the audit's instances of
"output written through others' links" beyond the ones the review named.  Real users
(``tests/support/users.py``) plant the traps in a shared sticky directory, as on /tmp."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support import fuse_mounts_under, run_tensorfs
from tests.support.models import write_safetensors
from tests.support.users import needs_users


def _one_line(result) -> str:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensorfs: error: "), result.stderr
    return lines[0]


@pytest.fixture
def shared(shared_dir):
    """A sticky directory every user can write (what /tmp is), and root's model and mount
    point beside it (in ``shared_dir``, which detaches what is left mounted)."""
    (shared_dir / "shared").mkdir()
    (shared_dir / "shared").chmod(0o1777)
    (shared_dir / "mnt").mkdir()
    write_safetensors(shared_dir / "model.safetensors")
    return shared_dir


@needs_users
@pytest.mark.parametrize("trap", ["symlink", "their-file", "hard-link"])
def test_log_is_never_written_through_another_users_link_or_into_their_file(users, shared, trap):
    """The review's ``--plot`` attack, played on the mount's ``--log``: root names a log in
    a shared directory where another user planted a link to root's 0600 secret (or their own
    world-writable file, which would collect root's log lines).  One line, nothing written,
    nothing mounted."""
    _, attacker = users
    secret = shared / "secret"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    log = shared / "shared" / "tensorfs.log"
    if trap == "symlink":
        assert attacker.run("ln", "-s", secret, log).returncode == 0
    elif trap == "their-file":
        assert attacker.run("sh", "-c", f"echo theirs > {log}; chmod 666 {log}").returncode == 0
    else:       # a second name of root's file (where protected_hardlinks lets anyone link)
        os.link(secret, log)
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (secret, log)}
    line = _one_line(run_tensorfs("mount", shared / "model.safetensors", shared / "mnt",
                                  "--log", log, timeout=60))
    assert line.startswith(f"tensorfs: error: --log {log}: ")
    assert {"symlink": "symbolic link of uid", "their-file": "belongs to uid",
            "hard-link": "hard links"}[trap] in line
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (secret, log)} == before
    assert fuse_mounts_under(shared) == []


@needs_users
@pytest.mark.parametrize("trap", ["their-link-to-a-directory", "their-directory"])
def test_log_is_never_created_through_a_directory_another_user_controls(users, shared, trap):
    """The --disk-cache parent-chain attack, played on ``--log``: root names
    ``shared/logs/authorized_keys``-style paths where ``logs`` is another user's link to
    root's private directory, or another user's directory (they can swap what is in it)."""
    _, attacker = users
    private = shared / "root-private"
    private.mkdir(mode=0o700)
    (private / "tensorfs.log").write_text("root's own file\n")
    before = (private / "tensorfs.log").read_bytes()
    logs = shared / "shared" / "logs"
    if trap == "their-link-to-a-directory":
        assert attacker.run("ln", "-s", private, logs).returncode == 0
    else:
        assert attacker.run("mkdir", "-m", "777", logs).returncode == 0
    line = _one_line(run_tensorfs("mount", shared / "model.safetensors", shared / "mnt",
                                  "--log", logs / "tensorfs.log", timeout=60))
    assert f"{logs} is a symbolic link of uid " in line or f"{logs}: it belongs to uid " in line, line
    assert (private / "tensorfs.log").read_bytes() == before
    assert sorted(os.listdir(private)) == ["tensorfs.log"]
    assert not (trap == "their-directory" and os.listdir(logs))
    assert fuse_mounts_under(shared) == []


def test_log_in_a_directory_others_can_write_without_the_sticky_bit_is_refused(shared):
    lax = shared / "lax"
    lax.mkdir()
    lax.chmod(0o777)
    line = _one_line(run_tensorfs("mount", shared / "model.safetensors", shared / "mnt",
                                  "--log", lax / "x.log", timeout=60))
    assert line == (f"tensorfs: error: --log {lax}/x.log: {lax}: anyone can write it "
                    f"(mode 0777) and it is not sticky, so they can move what is in it")
    assert os.listdir(lax) == []
    lax.chmod(0o775)            # a group's, as /var/log is on Ubuntu (root:syslog): fine
    assert run_tensorfs("mount", shared / "model.safetensors", shared / "mnt",
                        "--log", lax / "x.log", timeout=60).returncode == 0
    subprocess.run(["fusermount3", "-u", shared / "mnt"], check=True)
    assert "serving" in (lax / "x.log").read_text()


def test_a_log_link_of_ones_own_and_dev_stderr_are_still_followed(shared):
    """What the rule allows: a link the user made (or root's /dev/stderr)."""
    own = shared / "mine.log"
    link = shared / "shared" / "link.log"
    link.symlink_to(own)
    assert run_tensorfs("mount", shared / "model.safetensors", shared / "mnt",
                        "--log", link).returncode == 0
    subprocess.run(["fusermount3", "-u", shared / "mnt"], check=True)
    assert "serving" in own.read_text()
    result = subprocess.run(f"timeout 60 {' '.join(map(str, _tensorfs()))} mount "
                            f"{shared / 'model.safetensors'} {shared / 'mnt'} --log /dev/stderr"
                            f" && fusermount3 -u {shared / 'mnt'}", shell=True,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_a_fifo_as_log_that_nobody_reads_is_one_line_not_a_hang(shared):
    fifo = shared / "shared" / "log.fifo"
    os.mkfifo(fifo)
    line = _one_line(run_tensorfs("mount", shared / "model.safetensors", shared / "mnt",
                                  "--log", fifo, timeout=60))
    assert line == (f"tensorfs: error: --log {fifo}: a FIFO that no process reads, or a "
                    "socket: not a file to append to")
    assert fuse_mounts_under(shared) == []


def test_a_socket_as_log_is_one_line(shared):
    import socket

    path = shared / "shared" / "log.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))
        line = _one_line(run_tensorfs("mount", shared / "model.safetensors", shared / "mnt",
                                      "--log", path, timeout=60))
    assert line.startswith(f"tensorfs: error: --log {path}: ") and "socket" in line
    assert fuse_mounts_under(shared) == []


def _tensorfs():
    from tests.support.commands import TENSORFS

    return TENSORFS
