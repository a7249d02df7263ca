"""Real users for the attacks a second user on the machine would make (``useradd`` and
``setpriv``, as root): ``User`` runs commands as one, ``needs_users`` skips where that cannot
be done, and ``make_users`` makes the session's two (the ``users`` fixture in conftest.py,
defined once so that every module shares them)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.commands import TENSORFS

IS_ROOT = os.geteuid() == 0
HAVE_TOOLS = all(shutil.which(t) for t in ("useradd", "userdel", "setpriv", "unshare"))
needs_users = pytest.mark.skipif(not (IS_ROOT and HAVE_TOOLS),
                                 reason="needs root with useradd/setpriv/unshare to play two "
                                        "real non-root users")


class User:
    def __init__(self, name: str):
        self.name = name
        self.uid = int(subprocess.run(["id", "-u", name], capture_output=True, text=True,
                                      check=True).stdout)

    def command(self, *args, env=None) -> list[str]:
        base = {"PATH": "/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8"}
        if os.environ.get("PYTHONPATH"):        # the code under test, where the run names it
            base["PYTHONPATH"] = os.environ["PYTHONPATH"]
        base.update(env or {})
        return ["env", "-i", *(f"{k}={v}" for k, v in base.items()),
                "setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--init-groups",
                *map(str, args)]

    def run(self, *args, env=None, cwd="/") -> subprocess.CompletedProcess:
        """``args`` run as this user, in a private mount namespace where the test's Python
        is reachable (see ``_reach_python``); /dev/fuse as it is."""
        user = shlex.join(self.command(*args, env=env))
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               f"{_reach_python()} exec {user}"], capture_output=True,
                              text=True, timeout=120, cwd=cwd, stdin=subprocess.DEVNULL)

    def tensorfs(self, *args, env=None) -> subprocess.CompletedProcess:
        return self.run(*TENSORFS, *args, env=env)

    def script_in_fuse_namespace(self, script: str, scratch: Path, env=None):
        """``script`` (sh) run as this user in a private mount namespace whose /dev/fuse
        the user may open: what a desktop user has.  Everything it mounts goes with the
        namespace's last process; the script must unmount what it mounts."""
        node = scratch / "fuse-node"
        user = shlex.join(self.command("sh", "-c", script, env=env))
        outer = (f"{_reach_python()} rm -f {node} && mknod {node} c 10 229 && chmod 666 {node} && "
                 f"mount --bind {node} /dev/fuse && {user}")
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", outer],
                              capture_output=True, text=True, timeout=180, cwd="/",
                              stdin=subprocess.DEVNULL)


_KEEP: list[str] = []          # the mount points _reach_python made, removed with the users


def _reach_python() -> str:
    """Shell commands (for a private mount namespace, as root) that let any user run the
    test's Python, the venv's ``tensorfs`` and the code it imports: a venv or a clone made
    by root may lie under /root (0700), and the interpreter a venv points to too.  Each
    directory on the way that others cannot enter is covered with a 0755 tmpfs holding just
    the subdirectories on the way, bound from the originals (outer ones first, so a deeper
    one is covered inside what was bound back).  Nothing outside the namespace changes."""
    repo = Path(__file__).resolve().parents[2]
    targets = {Path(os.path.realpath(sys.executable)), Path(sys.executable), Path(sys.prefix),
               Path(os.path.realpath(sys.prefix)), repo}
    covers: dict[Path, set[str]] = {}
    for target in targets:
        for parent in reversed(target.parents):
            if parent != Path("/") and not os.stat(parent).st_mode & stat.S_IXOTH:
                covers.setdefault(parent, set()).add(target.relative_to(parent).parts[0])
    q = shlex.quote
    commands = []
    for parent in sorted(covers, key=lambda p: len(p.parts)):
        kept = []
        for child in sorted(covers[parent]):
            keep = tempfile.mkdtemp(prefix="tensorfs-keep-")
            _KEEP.append(keep)
            kept.append((child, keep))
            commands.append(f"mount --bind {q(str(parent / child))} {q(keep)}")
        commands.append(f"mount -t tmpfs -o mode=0755 tmpfs {q(str(parent))}")
        for child, keep in kept:
            commands.append(f"mkdir {q(str(parent / child))} && "
                            f"mount --bind {q(keep)} {q(str(parent / child))}")
    return "".join(f"{c} && " for c in commands)


def private_namespace_problem() -> str | None:
    """Why no private mount namespace can be made here, or None: every test that runs in
    one (``unshare -m --propagation private``) asks first and skips with this line.  A
    chroot (``make check-debian13``) has none: its / is no mount point, so unshare cannot
    make it private."""
    try:
        probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                               capture_output=True, text=True)
    except FileNotFoundError:
        return "no private mount namespace here (no unshare command)"
    if probe.returncode != 0:
        return f"no private mount namespace here (unshare -m: {probe.stderr.strip()})"
    return None


def make_users():
    """Yields (victim, attacker), made for this session and removed after it."""
    made = []
    try:
        # names of this session's own: two test sessions at once must not share (or delete)
        # each other's users, nor their /tmp/tensorfs-UID
        problem = private_namespace_problem()
        if problem is not None:
            pytest.skip(problem)
        names = (f"tfs-victim-{os.getpid()}", f"tfs-attacker-{os.getpid()}")
        for name in names:
            made_it = subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name],
                                     capture_output=True, text=True)
            if made_it.returncode != 0:
                pytest.skip(f"cannot create test users: {made_it.stderr.strip()}")
            made.append(name)
        yield User(names[0]), User(names[1])
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)
        for path in _KEEP:
            os.rmdir(path)


@contextlib.contextmanager
def planted_link(attacker: User):
    """A shared directory every user may write, sticky as /tmp, holding ``theirs`` (a 0777
    directory of ``attacker``'s) and ``link`` (the attacker's symbolic link to it): yields
    (theirs, link), all removed afterwards.  A directory named below ``link`` is one the
    attacker can point anywhere."""
    shared = Path(tempfile.mkdtemp(prefix="tensorfs-shared-"))
    try:
        shared.chmod(0o1777)
        theirs = shared / "theirs"
        assert attacker.run("mkdir", "-m", "777", theirs).returncode == 0
        link = shared / "link"
        assert attacker.run("ln", "-s", theirs, link).returncode == 0
        yield theirs, link
    finally:
        shutil.rmtree(shared, ignore_errors=True)
