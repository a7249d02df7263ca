"""The daemon's life and its runtime files (issues 14 and 17, docs/reference/cli.md), through the real CLI.

Attacks on the runtime directory are played by real users: with root, the session creates two
(a victim and an attacker, ``useradd``) and runs commands as them with ``setpriv``; without
root these tests are skipped, saying so.  A non-root user's mount needs /dev/fuse, which on
this kind of machine only root may open: the tests that mount as the victim do it in a
private mount namespace (``unshare -m``) where /dev/fuse is a 0666 node of the same device,
and fusermount3 (setuid) does the rest, as on a desktop.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.support import (
    RUNTIME_DIR,
    TENSORFS,
    alive,
    direct_read,
    fuse_mounts_under,
    run_tensorfs,
    usage_error,
    wait_for,
)
from tests.support.models import write_safetensors
from tests.support.reliability_models import slow_filesystem
from tests.support.users import IS_ROOT, User, needs_users


def _one_line(result, code=1) -> str:
    if code == 2:
        return usage_error(result)          # the command's usage line, then the error line
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tensorfs: error: ") and "Traceback" not in result.stderr
    return lines[0]


def _runtime_files(mnt) -> list[str]:
    from tensorfs.runtime import _stem

    stem = _stem(str(mnt))
    base = Path(RUNTIME_DIR) / "tensorfs"
    return sorted(n for n in os.listdir(base) if stem in n) if base.exists() else []


def _daemon_pid(mnt) -> int:
    from tensorfs.cli.daemon import daemon_pid

    pid = daemon_pid(os.path.realpath(mnt))
    assert pid is not None
    return pid


def _list(*args) -> list[dict]:
    result = run_tensorfs("list", "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _dir_of(user: User, path: Path, mode: int) -> Path:
    path.mkdir()
    os.chown(path, user.uid, user.uid)
    path.chmod(mode)
    return path


def _model_for_everyone(directory: Path) -> Path:
    model = directory / "model.safetensors"
    write_safetensors(model)
    model.chmod(0o644)
    return model


# -- the runtime directory under attack ---------------------------------------------------------

@needs_users
@pytest.mark.parametrize("planted", ["directory", "symlink", "lax-mode"])
def test_a_runtime_dir_someone_else_controls_is_refused(users, shared_dir, planted):
    """XDG_RUNTIME_DIR unset (su, cron, ssh): the victim's files would go to /tmp/tensorfs-UID.
    The attacker made it first, full of symlinks to the victim's files; or made it a
    symlink; or the victim's own is writable by others.  Refused: nothing written."""
    victim, attacker = users
    rundir = Path(f"/tmp/tensorfs-{victim.uid}")
    shutil.rmtree(rundir, ignore_errors=True)
    if rundir.is_symlink():
        rundir.unlink()
    precious = shared_dir / "victim-home"
    precious.mkdir()
    bashrc, secret = precious / ".bashrc", precious / "secret"
    bashrc.write_text("# the victim's shell\n")
    secret.write_text("42\n")
    for f in (bashrc, secret):
        os.chown(f, victim.uid, victim.uid)
    before = {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in (bashrc, secret)}
    mnt = shared_dir / "mnt"
    mnt.mkdir()
    os.chown(mnt, victim.uid, victim.uid)
    model = _model_for_everyone(shared_dir)
    from tensorfs.runtime import _stem
    stem = _stem(str(mnt))
    try:
        if planted == "directory":
            trap = rundir
            assert attacker.run("mkdir", "-m", "777", trap).returncode == 0
        elif planted == "symlink":
            trap = _dir_of(attacker, shared_dir / "attacker-dir", 0o777)
            assert attacker.run("ln", "-s", trap, rundir).returncode == 0
        else:
            trap = rundir
            assert victim.run("mkdir", "-m", "777", trap).returncode == 0
            assert victim.run("chmod", "777", trap).returncode == 0
        links = {f"{stem}.pid": secret, f"{stem}.log": bashrc, f"{stem}.json": secret}
        for name, target in links.items():
            owner = victim if planted == "lax-mode" else attacker
            assert owner.run("ln", "-s", target, trap / name).returncode == 0
        for args in (["mount", model, mnt], ["mount", "--foreground", model, mnt]):
            line = _one_line(victim.tensorfs(*args))
            assert f"/tmp/tensorfs-{victim.uid}: refused as the runtime directory" in line
            assert {"directory": "belongs to uid", "symlink": "symbolic link",
                    "lax-mode": "can write it"}[planted] in line
        assert {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in (bashrc, secret)} == before
        assert fuse_mounts_under(mnt) == []
    finally:
        if rundir.is_symlink():
            rundir.unlink()
        shutil.rmtree(rundir, ignore_errors=True)


@needs_users
def test_root_passes_over_an_xdg_runtime_dir_owned_by_someone_else(users, tmp_path, shared_dir):
    """Root with XDG_RUNTIME_DIR set to a user's directory (sudo -E): the user could plant a
    symlink to a root-owned 0600 file.  Not used: the files go to /run/tensorfs."""
    _, attacker = users
    xdg = _dir_of(attacker, shared_dir / "attacker-xdg", 0o700)
    _dir_of(attacker, xdg / "tensorfs", 0o700)
    victim_file = tmp_path / "root-only"
    victim_file.write_text("root's\n")
    victim_file.chmod(0o600)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    from tensorfs.runtime import _stem
    stem = _stem(str(mnt))
    for suffix in (".pid", ".log", ".json"):
        assert attacker.run("ln", "-s", victim_file, xdg / "tensorfs" / (stem + suffix)).returncode == 0
    model = tmp_path / "model.safetensors"
    write_safetensors(model)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(xdg)}
    before = victim_file.read_bytes()
    result = subprocess.run([*TENSORFS, "mount", model, mnt], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    try:
        pid_file = Path("/run/tensorfs") / f"{stem}.pid"
        assert pid_file.read_text().strip().isdigit()
        assert stat.S_IMODE(os.stat("/run/tensorfs").st_mode) == 0o700
        assert victim_file.read_bytes() == before
        assert sorted(os.listdir(xdg / "tensorfs")) == sorted(stem + s for s in (".json", ".log", ".pid"))
    finally:
        done = subprocess.run([*TENSORFS, "unmount", mnt], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert not pid_file.exists() and victim_file.read_bytes() == before


def test_a_group_writable_xdg_runtime_dir_is_passed_over(tmp_path):
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    xdg.chmod(0o777)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(xdg)}
    result = subprocess.run([*TENSORFS, "list"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert not (xdg / "tensorfs").exists()


@needs_users
def test_a_non_root_user_mounts_lists_and_unmounts_with_a_private_runtime_dir(users, shared_dir):
    victim, _ = users
    rundir = Path(f"/tmp/tensorfs-{victim.uid}")
    shutil.rmtree(rundir, ignore_errors=True)
    model = _model_for_everyone(shared_dir)
    mnt = shared_dir / "mnt"
    mnt.mkdir()
    os.chown(mnt, victim.uid, victim.uid)
    t = " ".join(TENSORFS)
    script = (f"{t} mount {model} {mnt} && ls -ld {rundir} && {t} list --json && "
              f"cmp {mnt}/lm_head/weight.npy {mnt}/lm_head/weight.npy && "
              f"{t} unmount {mnt} && ls -A {rundir} && echo DONE")
    try:
        result = victim.script_in_fuse_namespace(script, shared_dir)
        assert result.returncode == 0 and "DONE" in result.stdout, result.stderr
        assert f"drwx------ 2 {victim.name} " in result.stdout or \
            f"drwx------ 2 {victim.uid} " in result.stdout
        listed = json.loads(result.stdout[result.stdout.index("["):result.stdout.rindex("]") + 1])
        assert [(r["mountpoint"], r["source"], r["tensors"], r["state"]) for r in listed] == \
            [(str(mnt), str(model), 13, "serving")]
        assert result.stdout.rstrip().endswith("DONE")     # ls -A: the runtime dir is empty again
        assert result.stdout.split("]")[-1].split() == ["DONE"]
    finally:
        shutil.rmtree(rundir, ignore_errors=True)


@needs_users
def test_a_refused_mount_says_fusermounts_reason_in_one_line(users, shared_dir):
    """-o allow_other without user_allow_other: fusermount3's own words, once; the log
    does not say "unmounted"."""
    if any(line.strip() == "user_allow_other" for line in open("/etc/fuse.conf")):
        pytest.skip("/etc/fuse.conf allows allow_other to users here")
    victim, _ = users
    model = _model_for_everyone(shared_dir)
    mnt = shared_dir / "mnt"
    mnt.mkdir()
    os.chown(mnt, victim.uid, victim.uid)
    log = shared_dir / "logs"
    log.mkdir()
    os.chown(log, victim.uid, victim.uid)
    t = " ".join(TENSORFS)
    foreground = victim.script_in_fuse_namespace(
        f"{t} mount --foreground {model} {mnt} -o allow_other; echo rc=$?", shared_dir,
        env={"XDG_RUNTIME_DIR": ""})
    assert "rc=1" in foreground.stdout and len(foreground.stderr.splitlines()) == 1, \
        foreground.stderr
    assert "user_allow_other" in foreground.stderr
    result = victim.script_in_fuse_namespace(
        f"{t} mount {model} {mnt} -o allow_other --log {log}/x.log; echo rc=$?; cat {log}/x.log",
        shared_dir, env={"XDG_RUNTIME_DIR": ""})
    lines = result.stderr.splitlines()
    assert "rc=1" in result.stdout and len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"tensorfs: error: {mnt}: mount failed: ")
    assert "user_allow_other" in line and "/etc/fuse.conf" in line
    assert line.count("mount failed") == 1 and "error: error" not in line
    assert "unmounted" not in result.stdout and "user_allow_other" in result.stdout   # the log
    shutil.rmtree(f"/tmp/tensorfs-{victim.uid}", ignore_errors=True)


@needs_users
def test_dev_fuse_not_accessible_is_said_in_one_line(users, shared_dir):
    victim, _ = users
    if stat.S_IMODE(os.stat("/dev/fuse").st_mode) & 0o006:
        pytest.skip("/dev/fuse is open to every user here")
    model = _model_for_everyone(shared_dir)
    mnt = shared_dir / "mnt"
    mnt.mkdir()
    os.chown(mnt, victim.uid, victim.uid)
    try:
        line = _one_line(victim.tensorfs("mount", model, mnt))
        assert line.startswith(f"tensorfs: error: {mnt}: mount failed: ")
        assert "/dev/fuse" in line and "Permission denied" in line
        assert line.count("mount failed") == 1
    finally:
        shutil.rmtree(f"/tmp/tensorfs-{victim.uid}", ignore_errors=True)


# -- process hygiene --------------------------------------------------------------------------

def test_the_daemon_keeps_no_inherited_descriptor_flock(tmp_path):
    """flock(1) runs tensorfs holding the lock on an inherited descriptor: once mount
    returns, the lock must be free (the daemon does not keep it)."""
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    lock = tmp_path / "lock"
    held = subprocess.run(["flock", lock, *TENSORFS, "mount", model, mnt], capture_output=True,
                          text=True, timeout=120)
    assert held.returncode == 0, held.stderr
    try:
        assert subprocess.run(["flock", "-n", lock, "true"]).returncode == 0
        pid = _daemon_pid(mnt)
        targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        assert str(lock) not in targets
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
    finally:
        assert run_tensorfs("unmount", mnt).returncode == 0


def test_the_daemon_works_from_root_dir_and_relative_paths_still_serve(tmp_path):
    """The daemon chdirs to /: the caller's directory stays free, and a model named by a
    relative path keeps serving (its path checks use the absolute path)."""
    work = tmp_path / "work"
    work.mkdir()
    tensors = write_safetensors(work / "m.safetensors")
    (work / "mnt").mkdir()
    log = tmp_path / "daemon.log"
    result = subprocess.run([*TENSORFS, "mount", "m.safetensors", "mnt", "--debug", "--log", log],
                            cwd=work, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    mnt = work / "mnt"
    try:
        pid = _daemon_pid(mnt)
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        weight = mnt / "lm_head" / "weight"
        assert weight.read_bytes() == tensors["lm_head.weight"].tobytes()
        # the path is checked at most once a second, on a read: read (O_DIRECT: each read
        # reaches the daemon) until the log says the check was made, from "/"
        assert wait_for(lambda: direct_read(weight)
                        and "the path still names the mounted file" in log.read_text(), 10)
        assert (mnt / "model" / "layers" / "0" / "bool").read_bytes() == \
            tensors["model.layers.0.bool"].tobytes()
        row = next(r for r in _list() if r["mountpoint"] == str(mnt))
        assert row["state"] == "serving" and row["source"] == str(work / "m.safetensors")
    finally:
        assert run_tensorfs("unmount", mnt).returncode == 0


def test_unmount_refuses_a_fuse_mount_that_is_not_tensorfs(tmp_path_factory):
    with slow_filesystem(tmp_path_factory.mktemp("otherfs"), 0.0) as (_src, other):
        line = _one_line(run_tensorfs("unmount", other))
        assert "not a tensorfs mount" in line
        assert fuse_mounts_under(other)                       # still there
        assert "not a tensorfs mount" in _one_line(run_tensorfs("unmount", "--lazy", other))
        assert fuse_mounts_under(other)


@pytest.mark.skipif(not IS_ROOT, reason="needs root to mount a tiny tmpfs")
def test_enospc_writing_the_pid_file_leaves_no_stray_file(tmp_path):
    base = tmp_path / "tiny"
    base.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", base], check=True)
    try:
        (base / "tensorfs").mkdir(mode=0o700)
        fd = os.open(base / "fill", os.O_WRONLY | os.O_CREAT)      # the disk is now full
        try:
            while os.write(fd, b"x" * 4096):
                pass
        except OSError:
            pass
        os.close(fd)
        model = tmp_path / "m.safetensors"
        write_safetensors(model)
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        log = tmp_path / "daemon.log"
        env = {**os.environ, "XDG_RUNTIME_DIR": str(base)}
        for extra in ([], ["--foreground"]):
            result = subprocess.run([*TENSORFS, "mount", *extra, model, mnt, "--log", log],
                                    capture_output=True, text=True, env=env, timeout=120)
            line = _one_line(result)
            assert "No space left on device" in line and ".pid" in line
            assert os.listdir(base / "tensorfs") == []
            assert fuse_mounts_under(tmp_path) == []
        assert "unmounted" not in log.read_text()
    finally:
        subprocess.run(["umount", base], check=True)


# -- list ---------------------------------------------------------------------------------------

def test_list_tells_two_mounts_of_same_named_models_apart_and_a_changed_source(tmp_path):
    from safetensors.numpy import save_file

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_safetensors(a / "model.safetensors")
    save_file({"x": np.arange(64, dtype=np.float32)}, str(b / "model.safetensors"))
    mnts = [tmp_path / "mnt a", tmp_path / "mnt-b"]
    for model, mnt in zip((a, b), mnts):
        mnt.mkdir()
        assert run_tensorfs("mount", model / "model.safetensors", mnt).returncode == 0
    try:
        rows = {r["mountpoint"]: r for r in _list() if r["mountpoint"].startswith(str(tmp_path))}
        assert rows.keys() == {str(m) for m in mnts}
        ra, rb = rows[str(mnts[0])], rows[str(mnts[1])]
        assert (ra["source"], ra["tensors"], ra["state"]) == (str(a / "model.safetensors"), 13, "serving")
        assert (rb["source"], rb["tensors"], rb["state"]) == (str(b / "model.safetensors"), 1, "serving")
        assert ra["pid"] == _daemon_pid(mnts[0]) and rb["pid"] == _daemon_pid(mnts[1])
        table = run_tensorfs("list").stdout.splitlines()
        assert table[0].split() == ["MOUNTPOINT", "SOURCE", "PID", "TENSORS", "STATE"]
        row = next(line for line in table if line.startswith(str(mnts[1]) + " "))
        assert row.split() == [str(mnts[1]), str(b / "model.safetensors"), str(rb["pid"]), "1",
                               "serving"]

        # the model under b is rewritten in place: reads fail, list says why
        data = bytearray((b / "model.safetensors").read_bytes())
        data[-4:] = b"\x01\x02\x03\x04"
        (b / "model.safetensors").write_bytes(bytes(data))
        with pytest.raises(OSError):
            (mnts[1] / "x").read_bytes()
        changed = next(r for r in _list() if r["mountpoint"] == str(mnts[1]))
        assert changed["state"] == "source changed"
        assert "rewritten" in changed["reason"] and str(b / "model.safetensors") in changed["reason"]
        assert "source changed: " in run_tensorfs("list").stdout
    finally:
        for mnt in mnts:
            assert run_tensorfs("unmount", mnt).returncode == 0
    assert not any(r["mountpoint"].startswith(str(tmp_path)) for r in _list())
    for mnt in mnts:
        assert _runtime_files(mnt) == []          # pid, status and the default log are gone


def test_list_shows_a_url_without_its_credentials():
    from tensorfs.sources.urls import shown_source

    assert shown_source("https://user:hunter2@example.org:8443/m.gguf?X-Amz-Signature=abc") == \
        "https://example.org:8443/m.gguf?…"
    assert "hunter2" not in shown_source("s3://AKIA:hunter2@bucket/m.safetensors")


def test_list_says_a_daemon_that_died(tmp_path):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    assert run_tensorfs("mount", model, mnt).returncode == 0
    pid = _daemon_pid(mnt)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not alive(pid), 10)
    row = next(r for r in _list() if r["mountpoint"] == str(mnt))
    assert row["state"] == "daemon gone" and row["pid"] is None
    assert run_tensorfs("unmount", mnt).returncode == 0
    assert [f for f in _runtime_files(mnt) if not f.endswith(".log")] == []


# -- a clean unmount removes the default log; a failed mount keeps it and says why -------------

def test_default_log_removed_after_clean_unmount(tmp_path):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    assert run_tensorfs("mount", model, mnt).returncode == 0
    assert sorted(f.rsplit(".", 1)[1] for f in _runtime_files(mnt)) == ["json", "log", "pid"]
    assert run_tensorfs("unmount", mnt).returncode == 0
    assert _runtime_files(mnt) == []


def test_log_into_a_missing_directory_is_said_before_forking(tmp_path):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    line = _one_line(run_tensorfs("mount", model, mnt, "--log", tmp_path / "nowhere" / "x.log"))
    assert line == f"tensorfs: error: --log {tmp_path}/nowhere/x.log: No such file or directory"
    assert fuse_mounts_under(tmp_path) == [] and _runtime_files(mnt) == []


# -- -o ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("option,named", [
    ("rw", "-o rw: not allowed: a tensorfs mount is read-only"),
    ("ro,rw", "-o rw: not allowed"),
    ("fsname=a\\,rw", "-o fsname=a\\: a backslash"),
    ("fsname=x\\", "-o fsname=x\\: a backslash"),
    ("fsname=a\x1b[31mb", "-o fsname=a\\x1b[31mb: "),
    ("subtype=other", "-o subtype=other: not allowed: tensorfs sets subtype itself"),
    ("allow_other=1", "-o allow_other=1: allow_other takes no value"),
    ("max_read=lots", "-o max_read=lots: max_read takes a whole number"),
    ("max_read=0", "-o max_read=0: max_read takes a whole number"),
    ("attr_timeout=-1", "-o attr_timeout=-1: attr_timeout takes a number of seconds"),
    ("entry_timeout=nan", "-o entry_timeout=nan: "),
    ("user_id=0", "-o user_id=0: not allowed"),
    ("frobnicate", "-o frobnicate: unknown or not allowed option"),
])
def test_refused_options_are_named_in_one_line(tmp_path, option, named):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    line = _one_line(run_tensorfs("mount", model, mnt, "-o", "allow_other", "-o", option), code=2)
    assert line.startswith("tensorfs: error: " + named), line
    assert "\x1b" not in line
    assert fuse_mounts_under(tmp_path) == []


@pytest.mark.skipif(not IS_ROOT, reason="allow_other needs user_allow_other for a non-root user")
def test_allowed_options_reach_the_mount_read_only(tmp_path, mount):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = mount(model, "-o", "allow_other,default_permissions,fsname=my-model,dev,suid,noatime")
    line = next(m for m in open("/proc/self/mountinfo") if f" {mnt} " in m)
    mount_opts, super_opts = line.split()[5].split(","), line.split(" - ")[1].split()
    assert "ro" in mount_opts and "nodev" in mount_opts and "nosuid" in mount_opts
    assert super_opts[:2] == ["fuse.tensorfs", "my-model"]
    assert "allow_other" in super_opts[2]


# -- control characters never reach the terminal -----------------------------------------------

def test_control_characters_in_names_are_escaped_in_error_lines_list_and_logs(tmp_path):
    evil = "\x1b]0;owned\x07\x1b[2J\x9b"
    bad = tmp_path / f"bad{evil}.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"t\x1b\x07\": 1}   ")
    missing = tmp_path / f"mnt{evil}"
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (["inspect", bad], ["mount", bad, empty], ["mount", tmp_path / "x", missing],
                 ["unmount", missing], ["mount", bad, missing, "-o", f"fsname={evil}"]):
        result = run_tensorfs(*args)
        assert result.returncode in (1, 2)
        assert not any(c in result.stderr for c in "\x1b\x07\x9b"), repr(result.stderr)
        line = usage_error(result) if result.returncode == 2 else result.stderr.strip()
        assert "\\x1b" in line and len(result.stderr.splitlines()) == result.returncode

    model = tmp_path / f"good{evil}.safetensors"
    write_safetensors(model)
    mnt = tmp_path / f"mnt{evil}"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    assert run_tensorfs("mount", model, mnt, "--log", log).returncode == 0
    try:
        listed = run_tensorfs("list")
        assert listed.returncode == 0 and "\\x1b]0;owned\\x07" in listed.stdout
        assert not any(c in listed.stdout for c in "\x1b\x07\x9b")
    finally:
        assert run_tensorfs("unmount", mnt).returncode == 0
    text = log.read_text()
    assert "mounting" in text and "unmounted" in text and "\\x1b" in text
    assert not any(c in text for c in "\x1b\x07\x9b")


# -- messages ----------------------------------------------------------------------------------

def test_swapped_arguments_and_missing_unmount_target_are_said(tmp_path):
    model = tmp_path / "model.safetensors"
    write_safetensors(model)
    empty = tmp_path / "empty"
    empty.mkdir()
    line = _one_line(run_tensorfs("mount", empty, model))
    assert "swapped" in line and "tensorfs mount MODEL MOUNTPOINT" in line
    line = _one_line(run_tensorfs("unmount", tmp_path / "no-such-dir"))
    assert line == f"tensorfs: error: {tmp_path}/no-such-dir: no such file or directory"
    assert "not mounted" in _one_line(run_tensorfs("unmount", empty))


def test_help_of_each_command_says_what_model_and_options_are():
    mount_help = run_tensorfs("mount", "--help").stdout
    for words in ("index", "directory", "first shard", "URL", "--layout", "flat", "--cache-size",
                  "converted", "--debug", "traceback", "rw is refused"):
        assert words in mount_help, words
    inspect_help = run_tensorfs("inspect", "--help").stdout
    assert "first shard" in inspect_help and "URL" in inspect_help
    assert "calling user" in run_tensorfs("list", "--help").stdout
    assert "list" in run_tensorfs("--help").stdout


# -- fstab: the fuse(8) calling convention -----------------------------------------------------

def test_mount_the_way_mount_fuse3_runs_it(tmp_path):
    """An fstab line ``MODEL MNT fuse.tensorfs ro,allow_other,nofail 0 0`` makes mount.fuse3 run
    ``/bin/sh -c "'tensorfs' 'MODEL' 'MNT' '-o' 'ro,allow_other,dev,suid'"`` (it adds dev,suid
    and drops nofail); mount(8) may add rw.  The mount comes up read-only, nodev, nosuid."""
    model = tmp_path / "m.safetensors"
    tensors = write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    tensorfs = TENSORFS[0] if len(TENSORFS) == 1 else None
    if tensorfs is None:
        pytest.skip("the tensorfs script is not installed next to this python")
    helper = Path(tensorfs).with_name("mount.fuse.tensorfs")
    for command in ([tensorfs, model, mnt, "-o", "rw,allow_other,dev,suid,_netdev,x-systemd.automount"],
                    [helper, model, mnt, "-o", "rw,noatime", "-n"]):
        quoted = " ".join(f"'{c}'" for c in map(str, command))
        result = subprocess.run(["/bin/sh", "-c", quoted], capture_output=True, text=True,
                                timeout=120, cwd="/")
        assert result.returncode == 0 and result.stderr == "", result.stderr
        try:
            line = next(m for m in open("/proc/self/mountinfo") if f" {mnt} " in m)
            assert {"ro", "nodev", "nosuid"} <= set(line.split()[5].split(","))
            assert line.split(" - ")[1].startswith("fuse.tensorfs ")
            assert (mnt / "lm_head" / "weight").read_bytes() == tensors["lm_head.weight"].tobytes()
        finally:
            assert run_tensorfs("unmount", mnt).returncode == 0
    if shutil.which("mount.fuse3") and IS_ROOT:
        env = {**os.environ, "PATH": f"{Path(tensorfs).parent}:{os.environ.get('PATH', '')}"}
        result = subprocess.run(["mount.fuse3", model, mnt, "-t", "fuse.tensorfs", "-o",
                                 "ro,nofail"], capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == 0, result.stderr
        assert (mnt / "lm_head" / "weight").read_bytes() == tensors["lm_head.weight"].tobytes()
        assert run_tensorfs("unmount", mnt).returncode == 0
    refused = subprocess.run([tensorfs, model, mnt, "-o", "subtype=x"], capture_output=True, text=True)
    assert _one_line(refused, code=2).startswith("tensorfs: error: -o subtype=x")


def test_the_daemon_does_not_keep_the_callers_ignored_or_blocked_signals(tmp_path):
    """Started the way nohup or a non-interactive shell's ``&`` start it (SIGHUP, SIGINT,
    SIGTERM ignored, some blocked), the daemon still stops cleanly on SIGTERM."""
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def like_nohup():
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})

    result = subprocess.run([*TENSORFS, "mount", model, mnt], capture_output=True, text=True,
                            timeout=120, preexec_fn=like_nohup)
    assert result.returncode == 0, result.stderr
    pid = _daemon_pid(mnt)
    os.kill(pid, signal.SIGTERM)
    if not wait_for(lambda: not alive(pid), 20):
        os.kill(pid, signal.SIGKILL)
        subprocess.run(["fusermount", "-uz", str(mnt)], capture_output=True)
        pytest.fail("the daemon ignored SIGTERM")
    assert wait_for(lambda: not fuse_mounts_under(mnt), 10)
    assert _runtime_files(mnt) == []


def test_control_characters_in_a_tensor_name_or_key_never_reach_the_terminal(tmp_path):
    """A refused tensor (its name in the error line) and a metadata key with ESC/BEL; the
    mount of a valid model with such names logs nothing raw either, even with --debug."""
    import struct

    evil = "w\x1b]0;owned\x07\x1b[2J"
    header = json.dumps({evil: {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]},
                         "__metadata__": {evil: evil}}).encode()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (["inspect", bad], ["mount", bad, empty], ["--debug", "mount", bad, empty]):
        result = run_tensorfs(*args)
        assert result.returncode == 1
        assert not any(c in result.stderr for c in "\x1b\x07"), repr(result.stderr)

    from safetensors.numpy import save_file

    good = tmp_path / "good.safetensors"
    save_file({evil: np.arange(4, dtype=np.float32)}, str(good), metadata={evil: evil})
    inspected = run_tensorfs("inspect", good)
    assert inspected.returncode == 0 and not any(c in inspected.stdout for c in "\x1b\x07")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "debug.log"
    assert run_tensorfs("mount", good, mnt, "--debug", "--log", log).returncode == 0
    try:
        subprocess.run(["find", str(mnt)], capture_output=True, check=True)
        (mnt / "no-such-file").exists()
    finally:
        assert run_tensorfs("unmount", mnt).returncode == 0
    assert not any(c in log.read_text() for c in "\x1b\x07")


def test_a_mount_made_without_xdg_runtime_dir_is_listed_and_unmounted_from_a_shell_with_it(tmp_path):
    """fstab mounts run without the login shell's XDG_RUNTIME_DIR: their files are in
    /run/tensorfs (root) or /tmp/tensorfs-UID, and list / unmount look there too."""
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    bare = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    result = subprocess.run([*TENSORFS, "mount", model, mnt], capture_output=True, text=True,
                            env=bare, timeout=120)
    assert result.returncode == 0, result.stderr
    elsewhere = "/run/tensorfs" if IS_ROOT else f"/tmp/tensorfs-{os.geteuid()}"
    from tensorfs.runtime import _stem
    pid_file = Path(elsewhere) / f"{_stem(str(mnt))}.pid"
    pid = int(pid_file.read_text())
    row = next(r for r in _list() if r["mountpoint"] == str(mnt))     # the suite's XDG dir
    assert (row["pid"], row["state"], row["source"]) == (pid, "serving", str(model))
    assert run_tensorfs("unmount", mnt).returncode == 0
    assert not alive(pid)                       # unmount found the daemon and waited for it
    assert not pid_file.exists()


def test_a_caller_reading_the_commands_output_through_pipes_sees_their_end(tmp_path):
    """`tensorfs mount … 2>&1 | cat` and a pipe handed down on descriptor 3+: once mount
    returns, no daemon holds a writing end, so the reader sees end-of-file."""
    import select

    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r, w = os.pipe()
    out_r, out_w = os.pipe()
    try:
        proc = subprocess.Popen([*TENSORFS, "mount", model, mnt], stdout=out_w, stderr=out_w,
                                pass_fds=(w,), stdin=subprocess.DEVNULL)
        os.close(w)
        os.close(out_w)
        assert proc.wait(timeout=120) == 0
        for fd in (r, out_r):
            readable, _, _ = select.select([fd], [], [], 20)
            assert readable and os.read(fd, 100) == b"", "a daemon kept the caller's pipe open"
    finally:
        os.close(r)
        os.close(out_r)
        assert run_tensorfs("unmount", mnt).returncode == 0


@pytest.mark.parametrize("option", ["exec", "noexec", "atime", "noatime", "auto_unmount",
                                    "allow_root", "nothreads", "kernel_cache", "use_ino",
                                    "attr_timeout=0.5", "negative_timeout=0"])
def test_every_allowed_option_mounts(tmp_path, mount, option):
    """The allow-list holds nothing libfuse would refuse (relatime was, and is not allowed)."""
    if option == "allow_root" and not IS_ROOT:
        pytest.skip("allow_root needs user_allow_other for a non-root user")
    model = tmp_path / "m.safetensors"
    tensors = write_safetensors(model)
    mnt = mount(model, "-o", option)
    assert (mnt / "lm_head" / "weight").read_bytes() == tensors["lm_head.weight"].tobytes()


# -- long work started ahead, cancelled at the end ------------------------------------------

@pytest.mark.slow
def test_metadata_json_is_measured_in_the_background_and_its_wait_ends_with_the_mount(
        tmp_path, mount):
    """metadata.json's size is its whole content (O(model): 50 MB for 200,000 tensors):
    generated by the daemon from the mount's start, before anything asks, so that a stat
    seldom waits; a stat waiting for it when the mount is told to end is answered (an
    error) and the daemon exits."""
    from tests.support import daemon_pid
    from tests.support.bigmodels import write_sparse_safetensors

    model = tmp_path / "many.safetensors"
    write_sparse_safetensors(model, {f"layers.{i // 10}.w{i % 10}": 16 for i in range(200_000)})
    log = tmp_path / "daemon.log"
    mnt = mount(model, "--log", log, "--debug")
    assert wait_for(lambda: "metadata.json: generating (start 1)" in log.read_text(), 30)
    assert json.loads((mnt / "metadata.json").read_bytes())["tensors"]["layers.7.w3"]["shape"] == [16]
    assert "metadata.json: generating (start 3)" not in log.read_text()

    # a fresh mount, stopped while its metadata.json is still being generated
    mnt2 = tmp_path / "second"
    mnt2.mkdir()
    assert run_tensorfs("mount", model, mnt2).returncode == 0
    pid = daemon_pid(mnt2)
    asker = subprocess.Popen(["stat", str(mnt2 / "metadata.json")], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    os.kill(pid, signal.SIGTERM)
    assert wait_for(lambda: not alive(pid), 20)
    assert asker.wait(20) is not None
    assert fuse_mounts_under(mnt2) == []
