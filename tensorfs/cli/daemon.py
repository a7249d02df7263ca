"""The daemon's life (docs/reference/cli.md): from a model ready to serve to a process serving it in
the background, and back.  Nothing here knows about models or FUSE: the CLI hands over a
``serve(on_ready)`` callable that mounts, calls ``on_ready`` once the mount is live and
returns when it is unmounted.

    tensorfs mount (parent)                  the daemon (forked child)
    log opened, two pipes made       fork    new session, cwd /, the caller's descriptors
                                             closed, stdin/stdout on /dev/null, stderr on
                                             a pipe to the parent; pid file; serve(on_ready)
    waits on the ready pipe     <-- "ok" --  on_ready: status file, "ok", stderr on /dev/null
    ... or prints the reason:  <-- error --  a failure before that: its message; what libfuse
       libfuse's and fusermount's own        and fusermount wrote to stderr goes to the parent,
       words, in one line                    which is where a refused mount says why

The runtime files (``tensorfs.runtime.files``): ``NAME.pid`` (the daemon's pid, one line: what
``unmount`` waits on), the status file ``NAME.json`` (``tensorfs.status``: what ``tensorfs
list`` shows) and the default log ``NAME.log``, removed after a clean unmount.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import signal
import stat
import threading
import time

from tensorfs import status
from tensorfs.errors import printable
from tensorfs.runtime import claims, userlog
from tensorfs.runtime import files as runtime

log = logging.getLogger("tensorfs")

READY_TIMEOUT_S = 60
# How long ``unmount`` waits for the daemon once its mount is gone, before it stops it
# (tests shorten it); then how long each of SIGTERM and SIGKILL is given.
UNMOUNT_WAIT_S = float(os.environ.get("TENSORFS_UNMOUNT_WAIT_S", "30"))
STOP_WAIT_S = 5.0
STDERR_LIMIT = 16 << 10          # what is kept of libfuse's / fusermount's words
LOADED = b"loaded\n"             # on the ready pipe: prepare() is done


class DaemonError(Exception):
    """A mount that did not come up, a daemon that did not go: one line, exit 1."""


# -- descriptors --------------------------------------------------------------------------

def inherited_descriptors() -> set[int]:
    """The descriptors above 2 open now: call it first thing, and the daemon closes these
    (a lock held by ``flock lock tensorfs mount …``, a pipe of the caller's) and keeps the
    ones tensorfs opened since (the model's files, a connection)."""
    listed = [int(name) for name in os.listdir("/proc/self/fd")]
    fds = set()
    for fd in listed:
        if fd > 2:
            try:
                os.fstat(fd)          # the directory listdir read through is closed again
            except OSError:
                continue
            fds.add(fd)
    return fds


# -- logs ---------------------------------------------------------------------------------

class _Formatter(logging.Formatter):
    """Log lines hold names from the model: escaped, so ``tail -f`` of a log is safe."""

    def format(self, record):
        return "\n".join(map(printable, super().format(record).split("\n")))


def _setup_logging(stream, debug: bool) -> None:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_Formatter("%(asctime)s tensorfs[%(process)d] %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    logging.raiseExceptions = False     # a full disk must not print logging's traceback


def open_log(path: str | None, mountpoint: str) -> tuple[str, int, bool]:
    """(path, descriptor, is_default) of the log, opened before the fork so that a
    ``--log`` into a missing directory is said at once.  The default log is opened in the
    runtime directory without following a symlink; ``--log FILE`` is the user's choice."""
    if path is None:
        rundir, dir_fd = runtime.open_runtime_dir()
        name = os.path.basename(runtime.default_log_file(mountpoint))
        try:
            fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
            if not stat.S_ISREG(os.fstat(fd).st_mode):     # a FIFO would block a writer
                os.close(fd)
                raise OSError(errno.EINVAL, "not a regular file")
        except OSError as error:
            raise DaemonError(f"{os.path.join(rundir, name)}: cannot open the log: "
                              f"{error.strerror}") from None
        finally:
            os.close(dir_fd)
        return os.path.join(rundir, name), fd, True
    try:
        # O_NOCTTY: the daemon leads its session, and a terminal it opened would become its
        # controlling terminal
        # ... and never another user's file or link (runtime.userlog)
        fd = userlog.open_user_log(path)
    except OSError as error:
        raise DaemonError(f"--log {path}: {error.strerror}") from None
    return os.path.abspath(path), fd, False


# -- runtime files --------------------------------------------------------------------------

def _pid_name(mountpoint: str) -> str:
    return os.path.basename(runtime.pid_file(mountpoint))


def _write(name: str, data: bytes) -> None:
    path, dir_fd = runtime.open_runtime_dir()
    try:
        runtime.write_file(dir_fd, name, data)
    except OSError as error:
        raise DaemonError(f"{os.path.join(path, name)}: cannot write: {error.strerror}") from None
    finally:
        os.close(dir_fd)


def _remove(path: str, mine: bool = True) -> None:
    """Remove a runtime file if it is this process's (or, ``mine`` False, whoever's)."""
    if mine and _read_pid(path, check=False) not in (None, os.getpid()) and \
            _read_pid(path) is not None:
        return                    # another live daemon's (a mount at the same place since)
    try:
        os.unlink(path)
    except OSError:
        pass


# -- the pid file: the daemon's pid, one line.  A daemon killed with SIGKILL leaves it behind,
#    and its pid may be reused: a process that started after the file was written is not
#    the one that wrote it (the file's mtime against /proc/PID/stat's start time).

def _started_at(pid: int) -> float | None:
    """When ``pid`` started, in seconds since the epoch (to about a second: boot time is)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _read_pid(path: str, check: bool = True) -> int | None:
    """The daemon's pid from its pid file; None when there is none, or (``check``) when that
    process is gone or is another one that got the pid after the daemon died."""
    data = runtime.read_file(path)
    try:
        pid = int(data.split()[0])
        written = os.lstat(path).st_mtime
    except (AttributeError, OSError, ValueError, IndexError):
        return None
    if not check:
        return pid
    if not running(pid):
        return None
    started = _started_at(pid)
    if started is not None and started > written + 2:   # 2 s: boot time is whole seconds
        return None
    return pid


def daemon_pid(mountpoint: str) -> int | None:
    """The pid of the live daemon serving ``mountpoint`` (a resolved path), or None.  Its
    pid file may be in another of the user's runtime directories than the current one."""
    for path in runtime.find_files(mountpoint, ".pid"):
        pid = _read_pid(path)
        if pid is not None:
            return pid
    return None


MOUNT_ASK_S = 5.0       # how long unmount waits for a mount to say its daemon's pid


def daemon_of_mount(mountpoint: str) -> int | None:
    """The pid of the daemon serving ``mountpoint`` (resolved), asked of the mount itself:
    its root's ``user.tensorfs.pid``, whatever runtime directory the daemon's files are in
    (a shell with another XDG_RUNTIME_DIR).  What it says is taken only for a live process
    of this user that holds /dev/fuse open; a mount that does not answer within
    ``MOUNT_ASK_S`` (a stopped daemon), a dead one (ENOTCONN) or an older daemon gives
    None."""
    from tensorfs.mount.adapter import PID_XATTR

    answer: list[bytes] = []

    def ask():
        try:
            answer.append(os.getxattr(mountpoint, PID_XATTR, follow_symlinks=False))
        except OSError:
            pass

    asking = threading.Thread(target=ask, name="tensorfs-ask-mount", daemon=True)
    asking.start()
    asking.join(MOUNT_ASK_S)
    try:
        pid = int(answer[0]) if answer else None
    except ValueError:
        return None
    return pid if pid is not None and pid > 0 and _serves_fuse(pid) else None


def _serves_fuse(pid: int) -> bool:
    """``pid`` is a live process of this user with /dev/fuse open: a FUSE daemon of ours."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid() or not running(pid):
            return False
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/fuse":
                return True
        except OSError:
            continue
    return False


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphaned daemon waits for init to reap it).  A process
    whose first thread is a zombie while other threads of it are still exiting (they hold
    its files: the daemon's /dev/fuse, the mount still connected) has not exited yet:
    ``unmount`` returned in that window, a daemon's threads still there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        if state not in (b"Z", b"X"):
            return True
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except (OSError, IndexError):
        return False


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def wait_exit(pid: int, mountpoint: str) -> str | None:
    """After ``mountpoint`` was unmounted: wait for its daemon to exit.  One that has not
    within ``UNMOUNT_WAIT_S`` (stopped, or stuck) serves nothing any more: it is sent
    SIGTERM, then SIGKILL.  None when it exited by itself; else the line that says what
    was done.  ``DaemonError`` (naming the pid) when it could not be ended."""
    if _wait_gone(pid, UNMOUNT_WAIT_S):
        return None
    said = f"{mountpoint}: the daemon (pid {pid}) did not exit within {UNMOUNT_WAIT_S:g} s " \
           f"after unmount"
    for sig, wait in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, STOP_WAIT_S)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return f"{said}: it exited"
        except OSError as error:
            raise DaemonError(f"{said}, and it cannot be stopped ({error.strerror}): "
                              f"kill {pid}") from None
        if _wait_gone(pid, wait):
            return f"{said}: stopped it with {sig.name}"
    raise DaemonError(f"{said}, nor after SIGKILL (blocked in the kernel): pid {pid}")


def forget(mountpoint: str) -> None:
    """Remove the runtime files of a mount whose daemon died (SIGKILL) without doing so."""
    for path in runtime.find_files(mountpoint, ".pid"):
        _remove(path)
    status.forget(mountpoint)


# -- the life ---------------------------------------------------------------------------------

class _Life:
    """One serving process's runtime files and readiness, the same in the foreground."""

    def __init__(self, mountpoint: str, info: dict, log_path: str, default_log: bool):
        self.mountpoint = mountpoint
        self.info = info
        self.log_path = log_path
        self.default_log = default_log
        self.pid_name = _pid_name(mountpoint)
        self.ready = False

    def start(self) -> None:
        _write(self.pid_name, f"{os.getpid()}\n".encode())
        claims.serving(self.mountpoint)     # a directory it holds (--edits) names this mount

    def on_ready(self) -> None:
        self.ready = True
        status.publish(self.mountpoint, {**self.info, "log": self.log_path})
        log.info("mounted %s at %s", self.info.get("source"), self.mountpoint)

    def run(self, serve, on_ready=None) -> bool:
        """Serve; True for a clean unmount.  The log says "unmounted" only for a mount that
        was up."""
        try:
            serve(on_ready or self.on_ready)
        except BaseException as error:
            if self.ready:
                log.exception("the mount at %s failed", self.mountpoint)
            else:
                log.error("mount at %s failed: %s", self.mountpoint, error)
            raise
        finally:
            status.withdraw()
            _remove(os.path.join(runtime.runtime_dir(), self.pid_name))
        if self.ready:
            log.info("unmounted %s", self.mountpoint)
        return self.ready


def _one_line(said: str, stderr: bytes, mountpoint: str) -> str:
    """The reason a mount failed, in one line: libfuse's and fusermount's own words when
    they said something, else the daemon's exception."""
    lines = []
    for line in stderr.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if line and line not in lines:
            lines.append(line)
    said = said.strip()
    if said.startswith(mountpoint + ": "):
        said = said[len(mountpoint) + 2:]
    if lines:
        # libfuse's own "mount failed" after fusermount's reason adds nothing
        reason = "; ".join(lines)
    else:
        reason = said or "the daemon exited"
    return printable(reason)


def run_foreground(serve, mountpoint: str, *, info: dict, log_path: str | None, log_fd: int | None,
                   debug: bool) -> None:
    """Serve in this process; stderr is captured while mounting so that a refusal is said
    in one line, as in the background."""
    import logging.handlers  # the foreground mount only: it pulls in socket, pickle ...

    saved = os.dup(2)
    stream = open(log_fd, "a", buffering=1) if log_fd is not None else \
        open(os.dup(saved), "w", buffering=1)
    _setup_logging(stream, debug)
    held = None
    if log_fd is None:
        # the log is the terminal: until the mount is up its lines are held, so that a
        # refused mount is one line there too (the error line carries the reason)
        root = logging.getLogger()
        held = logging.handlers.MemoryHandler(1 << 20, flushLevel=logging.CRITICAL + 1,
                                              target=root.handlers[0], flushOnClose=False)
        root.handlers[:] = [held]
    life = _Life(mountpoint, info, log_path or "stderr", False)
    life.start()
    r, w = os.pipe()
    captured: list[bytes] = []

    def drain():
        while True:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            if sum(map(len, captured)) < STDERR_LIMIT:
                captured.append(chunk)
        os.close(r)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    os.dup2(w, 2)
    os.close(w)
    restored = threading.Event()

    def restore():
        if not restored.is_set():
            restored.set()
            os.dup2(saved, 2)          # the pipe's last writer goes: the reader sees its end

    def on_ready():
        restore()
        reader.join(2)
        if captured:                  # libfuse's warnings on a mount that did come up
            os.write(2, b"".join(captured))
        if held is not None:
            held.flush()
            logging.getLogger().handlers[:] = [held.target]
        life.on_ready()

    try:
        life.run(serve, on_ready)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:
        restore()
        reader.join(2)
        if held is not None and not life.ready:
            held.buffer.clear()       # logging.shutdown would flush them after the line
        if debug:
            raise
        raise DaemonError(f"{mountpoint}: mount failed: "
                          f"{_one_line(str(error), b''.join(captured), mountpoint)}") from None
    finally:
        restore()
        os.close(saved)


def run_background(serve, mountpoint: str, *, info: dict, log_path: str, log_fd: int,
                   default_log: bool, inherited: set[int], debug: bool,
                   refusals: tuple = (), prepare=None) -> None:
    """Fork the daemon; return once it serves, or raise ``DaemonError`` saying why not.
    An exception of a class in ``refusals`` raised by ``serve`` before the mount is live
    (the daemon read the model and refused it) is said as its own line, as it would have
    been before the fork: nothing was mounted, and the default log goes.  ``prepare``, if
    given, runs in the daemon first (reading the model): it has its own time limits, so the
    wait for the mount to come up starts once it is done."""
    ready_r, ready_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(err_r)
        _daemon(serve, mountpoint, info=info, log_path=log_path, log_fd=log_fd,
                default_log=default_log, inherited=inherited, debug=debug,
                ready_w=ready_w, err_w=err_w, refusals=refusals, prepare=prepare)
    os.close(ready_w)
    os.close(err_w)
    try:
        message, stderr = _wait_ready(ready_r, err_r, pid, preparing=prepare is not None)
        if message.startswith("refused: "):
            if default_log:
                _remove(log_path, mine=False)
            raise DaemonError(message.removeprefix("refused: "))
        if message != "ok":
            reason = _one_line(message.removeprefix("error: "), stderr, mountpoint)
            # the daemon never saw libfuse's words (they came here): the log gets them too
            _setup_logging(open(os.dup(log_fd), "a", buffering=1), debug)
            log.error("mount at %s failed: %s", mountpoint, reason)
            logging.shutdown()
            raise DaemonError(f"{mountpoint}: mount failed: {reason} (log: {log_path})")
    finally:
        os.close(log_fd)


def _daemon(serve, mountpoint, *, info, log_path, log_fd, default_log, inherited, debug,
            ready_w, err_w, refusals=(), prepare=None) -> None:
    """The child: never returns."""
    code = 1
    life = None
    preparing = prepare is not None    # a refusal is said as such only while the model is read:
    try:                               # a failed mount's words are libfuse's (stderr), below
        os.setsid()
        os.chdir("/")                  # not the caller's directory: it stays unmountable
        # nor its signal state: started under nohup, or from a shell that runs background
        # jobs with SIGINT ignored, the daemon would not stop on SIGTERM/SIGINT/SIGHUP
        # (libfuse installs its handlers only where the default is in place)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        for fd in inherited - {ready_w, err_w, log_fd}:
            try:
                os.close(fd)
            except OSError:
                pass
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(err_w, 2)              # libfuse's and fusermount's words go to the parent
        os.close(err_w)
        _setup_logging(open(log_fd, "a", buffering=1), debug)
        life = _Life(mountpoint, info, log_path, default_log)

        def on_ready():
            life.on_ready()
            os.write(ready_w, b"ok")
            os.close(ready_w)
            os.dup2(devnull, 2)        # the parent is gone soon: nobody reads the pipe

        life.start()
        if prepare is not None:
            try:
                prepare()
            except BaseException:
                _remove(os.path.join(runtime.runtime_dir(), life.pid_name))
                raise
            os.write(ready_w, LOADED)
        preparing = False
        clean = life.run(serve, on_ready)
        code = 0
        if clean and default_log:
            logging.shutdown()
            _remove(log_path, mine=False)
    except BaseException as error:
        if not (life is not None and life.ready):    # after "ok" the parent is gone
            kind = "refused" if preparing and isinstance(error, refusals) else "error"
            try:
                os.write(ready_w, f"{kind}: {error}".encode("utf-8", "replace")[:4000])
            except OSError:
                pass
    finally:
        os._exit(code)


def _wait_ready(ready_fd: int, err_fd: int, pid: int, preparing: bool = False) -> tuple[str, bytes]:
    """What the daemon said on the ready pipe ("ok", "error: …", "" if it died), and what
    it wrote to stderr while mounting."""
    deadline = float("inf") if preparing else time.monotonic() + READY_TIMEOUT_S
    said, stderr = b"", b""
    open_fds = [ready_fd, err_fd]
    done = False
    while not done and time.monotonic() < deadline:
        readable, _, _ = select.select(open_fds, [], [], 0.5)
        for fd in readable:
            chunk = os.read(fd, 4096)
            if fd == err_fd:
                if chunk:
                    stderr = (stderr + chunk)[:STDERR_LIMIT]
                else:
                    open_fds.remove(err_fd)
                continue
            if not chunk:
                done = True
            else:
                said += chunk
                if said.startswith(LOADED):         # the model is read: now the mount
                    said = said[len(LOADED):]
                    deadline = time.monotonic() + READY_TIMEOUT_S
                if said == b"ok":
                    done = True
    os.close(ready_fd)
    if said != b"ok":
        # the daemon exited: collect the rest of its stderr (fusermount wrote before that)
        try:
            os.waitpid(pid, 0 if time.monotonic() < deadline else os.WNOHANG)
        except ChildProcessError:
            pass
        end = time.monotonic() + 2
        while err_fd in open_fds and time.monotonic() < end:
            readable, _, _ = select.select([err_fd], [], [], 0.2)
            if readable:
                chunk = os.read(err_fd, 4096)
                if not chunk:
                    break
                stderr = (stderr + chunk)[:STDERR_LIMIT]
        if not said and time.monotonic() >= deadline:
            said = f"error: the daemon did not report ready within {READY_TIMEOUT_S} s".encode()
    os.close(err_fd)
    return said.decode("utf-8", "replace"), stderr
