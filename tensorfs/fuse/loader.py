"""Finding and loading libfuse 3 (``libfuse3.so.4`` from 3.17 on, ``libfuse3.so.3`` before),
declaring the functions the binding calls, and sending libfuse's own messages to the log.
``libfuse()`` loads it once per process; ``FuseUnavailable`` is the one line a user sees when
it cannot be loaded or refuses a mount.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

from tensorfs.fuse.abi import (
    INTERRUPT_FUNC,
    ConnInfo,
    EntryParam,
    FileInfo,
    FuseArgs,
    FuseBufvec,
    FuseCtx,
    Stat,
    Statvfs,
)

log = logging.getLogger("tensorfs")


class FuseUnavailable(RuntimeError):
    """libfuse 3 is missing or refused the mount: said in one line by the CLI."""


# libfuse 3.17 renamed the shared object (ABI 4); nothing the binding uses changed with it.
SONAMES = ("libfuse3.so.4", "libfuse3.so.3")

NOT_LINUX = ("tensorfs mounts on Linux only ({system} here): it needs libfuse 3 and Linux's "
             "FUSE protocol (READDIRPLUS, 1 MiB requests), which macFUSE and BSD lack")


def _candidates() -> list[str]:
    """Where to look, in the dynamic linker's order: LD_LIBRARY_PATH's directories first
    (either name), then the system's cache.  Asking dlopen for one name after the other would
    let the cache's libfuse3.so.3 win over an LD_LIBRARY_PATH holding only libfuse3.so.4."""
    found = []
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        for name in SONAMES:
            path = os.path.join(directory, name)
            if directory and os.path.exists(path):
                found.append(path)
    return found + list(SONAMES)


def _load():
    if platform.system() != "Linux":
        raise FuseUnavailable(NOT_LINUX.format(system=platform.system()))
    if Stat is None:
        raise FuseUnavailable(f"no struct stat layout for {platform.machine()} "
                              f"(x86_64 and aarch64 only)")
    lib = None
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        raise FuseUnavailable("libfuse 3 not found (libfuse3.so.4 or libfuse3.so.3): "
                              "install Debian's fuse3 (apt-get install fuse3)")

    def fn(symbol, restype, *argtypes):
        f = getattr(lib, symbol)
        f.restype, f.argtypes = restype, list(argtypes)
        return f

    P, sz, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64
    lib.version = lib.fuse_version()                    # 317 for 3.17.x
    fn("fuse_pkgversion", ctypes.c_char_p)
    if hasattr(lib, "fuse_set_log_func"):                # 3.7 on
        fn("fuse_set_log_func", None, _LOG_FUNC)(_log_callback)
    if hasattr(lib, "fuse_unset_feature_flag"):          # 3.17.3 on (an inline before)
        fn("fuse_unset_feature_flag", None, ctypes.POINTER(ConnInfo), ctypes.c_uint64)
    fn("fuse_reply_err", ctypes.c_int, P, ctypes.c_int)
    fn("fuse_reply_none", None, P)
    fn("fuse_reply_entry", ctypes.c_int, P, ctypes.POINTER(EntryParam))
    fn("fuse_reply_attr", ctypes.c_int, P, ctypes.POINTER(Stat), ctypes.c_double)
    fn("fuse_reply_buf", ctypes.c_int, P, P, sz)
    fn("fuse_reply_open", ctypes.c_int, P, ctypes.POINTER(FileInfo))
    fn("fuse_reply_data", ctypes.c_int, P, ctypes.POINTER(FuseBufvec), ctypes.c_int)
    if hasattr(lib, "fuse_passthrough_open"):            # 3.17 on
        fn("fuse_passthrough_open", ctypes.c_int, P, ctypes.c_int)
    if hasattr(lib, "fuse_set_feature_flag"):            # 3.17.3 on (an inline before)
        fn("fuse_set_feature_flag", ctypes.c_bool, ctypes.POINTER(ConnInfo), ctypes.c_uint64)
    fn("fuse_reply_statfs", ctypes.c_int, P, ctypes.POINTER(Statvfs))
    fn("fuse_reply_write", ctypes.c_int, P, sz)
    fn("fuse_reply_create", ctypes.c_int, P, ctypes.POINTER(EntryParam), P)
    fn("fuse_req_ctx", ctypes.POINTER(FuseCtx), P)
    fn("fuse_req_interrupt_func", None, P, INTERRUPT_FUNC, P)
    fn("fuse_lowlevel_notify_inval_inode", ctypes.c_int, P, ctypes.c_uint64, i64, i64)
    fn("fuse_reply_xattr", ctypes.c_int, P, sz)
    fn("fuse_add_direntry", sz, P, P, sz, ctypes.c_char_p, ctypes.POINTER(Stat), i64)
    fn("fuse_add_direntry_plus", sz, P, P, sz, ctypes.c_char_p, ctypes.POINTER(EntryParam), i64)
    fn("fuse_session_new", P, ctypes.POINTER(FuseArgs), P, sz, P)
    fn("fuse_session_mount", ctypes.c_int, P, ctypes.c_char_p)
    fn("fuse_set_signal_handlers", ctypes.c_int, P)
    fn("fuse_remove_signal_handlers", None, P)
    fn("fuse_session_loop", ctypes.c_int, P)
    fn("fuse_session_unmount", None, P)
    fn("fuse_session_exited", ctypes.c_int, P)
    fn("fuse_session_destroy", None, P)
    if hasattr(lib, "fuse_session_loop_mt_312"):           # 3.12 and later
        fn("fuse_session_loop_mt_312", ctypes.c_int, P, P)
        fn("fuse_loop_cfg_create", P)
        fn("fuse_loop_cfg_destroy", None, P)
    else:
        fn("fuse_session_loop_mt_32", ctypes.c_int, P, P)
    return lib


# libfuse's own messages ("fuse: unknown option ...") go to stderr, which is /dev/null in the
# daemon: they are sent to the log instead, and the last error kept for the one error line.
_LOG_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_LOG_LEVELS = [logging.CRITICAL] * 3 + [logging.ERROR, logging.WARNING] + [logging.INFO] * 2 \
    + [logging.DEBUG]
libfuse_said = {"error": None, "partial": ""}


def _log_libfuse(level, fmt, ap):
    # ap is a va_list: a pointer on x86_64, and passed by reference on aarch64 (AAPCS64
    # passes a composite of 32 bytes by address), so vsnprintf takes it as it came.
    buf = ctypes.create_string_buffer(1024)
    _vsnprintf(buf, len(buf), fmt, ap)
    text = libfuse_said["partial"] + buf.value.decode(errors="replace")
    if not text.endswith("\n"):          # some messages come in pieces ("unknown option(s): `")
        libfuse_said["partial"] = text
        return
    libfuse_said["partial"] = ""
    text = " ".join(text.split())
    for prefix in ("fuse: ", "error: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    level = _LOG_LEVELS[min(max(level, 0), 7)]
    if level >= logging.ERROR:
        libfuse_said["error"] = text
    log.log(level, "libfuse: %s", text)


_log_callback = _LOG_FUNC(_log_libfuse)
_vsnprintf = ctypes.CDLL(None).vsnprintf
_vsnprintf.restype = ctypes.c_int
_vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]


def describe(lib) -> str:
    """"libfuse 3.17.2 (/usr/lib/.../libfuse3.so.3.17.2)": which library this process uses."""
    path = "?"
    try:
        with open("/proc/self/maps") as f:
            path = next((line.split()[-1] for line in f if "/libfuse3.so" in line), path)
    except OSError:
        pass
    return f"libfuse {lib.fuse_pkgversion().decode(errors='replace')} ({path})"


_lib = None


def libfuse():
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib
