"""libfuse 3's ABI as ctypes declares it: the C structures the binding fills or reads, the
capability and flag bits, and the order of ``struct fuse_lowlevel_ops``.  Linux x86_64 and
aarch64; tests/fuse/test_struct_layout.py compares each size, offset and constant with what the C
compiler says for the installed headers (and for each libfuse under shared/libfuse/).
"""

from __future__ import annotations

import ctypes
import platform

ROOT_INO = 1
# Capability bits (fuse_common.h, the same in every libfuse 3).
FUSE_CAP_SPLICE_WRITE = 1 << 7
FUSE_CAP_READDIRPLUS_AUTO = 1 << 14
FUSE_CAP_PASSTHROUGH = 1 << 29          # 3.17 on (Linux 6.9 on)
FUSE_CAP_PARALLEL_DIROPS = 1 << 18      # fuse_common.h: lookups in one directory at once
# struct fuse_buf's flags (enum fuse_buf_flags)
FUSE_BUF_IS_FD = 1 << 1
FUSE_BUF_FD_SEEK = 1 << 2
# struct fuse_file_info's bit fields, in the one 32-bit word after ``flags`` (GCC allocates
# bit fields from the least significant bit on little-endian machines;
# tests/fuse/test_struct_layout.py checks it)
FI_KEEP_CACHE = 1 << 2
FI_NOFLUSH = 1 << 7                     # 3.12 on; padding (ignored) before
# fuse_conn_info.max_backing_stack_depth: FUSE_BACKING_STACKED_OVER, so that a model on a
# stacked filesystem (overlayfs: a container's root) can be a backing file too; the cost is
# that this mount cannot itself be stacked under another overlay.
BACKING_STACKED_OVER = 1


# -- the C structures (Linux x86_64 and aarch64; tests/fuse/test_struct_layout.py compares each
# size and offset with what the C compiler says for the installed headers) -----------------

class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _StatX86_64(ctypes.Structure):
    _fields_ = [("st_dev", ctypes.c_uint64), ("st_ino", ctypes.c_uint64),
                ("st_nlink", ctypes.c_uint64), ("st_mode", ctypes.c_uint32),
                ("st_uid", ctypes.c_uint32), ("st_gid", ctypes.c_uint32),
                ("_pad0", ctypes.c_int32), ("st_rdev", ctypes.c_uint64),
                ("st_size", ctypes.c_int64), ("st_blksize", ctypes.c_int64),
                ("st_blocks", ctypes.c_int64), ("st_atim", Timespec),
                ("st_mtim", Timespec), ("st_ctim", Timespec),
                ("_reserved", ctypes.c_int64 * 3)]


class _StatGeneric64(ctypes.Structure):     # the kernel's asm-generic layout (aarch64)
    _fields_ = [("st_dev", ctypes.c_uint64), ("st_ino", ctypes.c_uint64),
                ("st_mode", ctypes.c_uint32), ("st_nlink", ctypes.c_uint32),
                ("st_uid", ctypes.c_uint32), ("st_gid", ctypes.c_uint32),
                ("st_rdev", ctypes.c_uint64), ("_pad1", ctypes.c_uint64),
                ("st_size", ctypes.c_int64), ("st_blksize", ctypes.c_int32),
                ("_pad2", ctypes.c_int32), ("st_blocks", ctypes.c_int64),
                ("st_atim", Timespec), ("st_mtim", Timespec), ("st_ctim", Timespec),
                ("_reserved", ctypes.c_int32 * 2)]


# struct stat is the C library's, so it is chosen by system and machine together: macOS on
# arm64 is not Linux on aarch64.  Only Linux is served at all (tensorfs.fuse.loader says why).
STAT_LAYOUTS = {("Linux", "x86_64"): _StatX86_64, ("Linux", "aarch64"): _StatGeneric64}
Stat = STAT_LAYOUTS.get((platform.system(), platform.machine()))


class EntryParam(ctypes.Structure):
    _fields_ = [("ino", ctypes.c_uint64), ("generation", ctypes.c_uint64), ("attr", Stat or ctypes.c_char),
                ("attr_timeout", ctypes.c_double), ("entry_timeout", ctypes.c_double)]


class Statvfs(ctypes.Structure):
    _fields_ = [("f_bsize", ctypes.c_ulong), ("f_frsize", ctypes.c_ulong),
                ("f_blocks", ctypes.c_uint64), ("f_bfree", ctypes.c_uint64),
                ("f_bavail", ctypes.c_uint64), ("f_files", ctypes.c_uint64),
                ("f_ffree", ctypes.c_uint64), ("f_favail", ctypes.c_uint64),
                ("f_fsid", ctypes.c_ulong), ("f_flag", ctypes.c_ulong),
                ("f_namemax", ctypes.c_ulong), ("_spare", ctypes.c_int * 6)]


class ConnInfo(ctypes.Structure):
    """struct fuse_conn_info: 128 bytes in every libfuse 3, each version giving more of the
    reserved tail a meaning: 3.17 ``capable_ext`` and ``want_ext`` (64-bit flags replacing
    ``capable`` and ``want``), 3.18 ``request_timeout``.  Before 3.17 the bytes declared here
    as those fields are reserved, and never touched."""
    _fields_ = [("proto_major", ctypes.c_uint32), ("proto_minor", ctypes.c_uint32),
                ("max_write", ctypes.c_uint32), ("max_read", ctypes.c_uint32),
                ("max_readahead", ctypes.c_uint32), ("capable", ctypes.c_uint32),
                ("want", ctypes.c_uint32), ("max_background", ctypes.c_uint32),
                ("congestion_threshold", ctypes.c_uint32), ("time_gran", ctypes.c_uint32),
                ("max_backing_stack_depth", ctypes.c_uint32),     # 3.17 on
                ("_flag_bits", ctypes.c_uint32),                   # no_interrupt:1, padding:31
                ("capable_ext", ctypes.c_uint64), ("want_ext", ctypes.c_uint64),
                ("_tail", ctypes.c_uint8 * 64)]      # reserved; 3.18 took request_timeout


class FileInfo(ctypes.Structure):
    """struct fuse_file_info: 40 bytes before 3.17, 64 from 3.17 on (``backing_id`` and the
    fields after it were the tail padding).  Only ``_bits`` (FI_*), ``fh`` and, from 3.17 on,
    ``backing_id`` are written."""
    _fields_ = [("flags", ctypes.c_int32), ("_bits", ctypes.c_uint32),
                ("_padding2", ctypes.c_uint32), ("_padding3", ctypes.c_uint32),
                ("fh", ctypes.c_uint64), ("lock_owner", ctypes.c_uint64),
                ("poll_events", ctypes.c_uint32),
                ("backing_id", ctypes.c_int32),                    # 3.17 on
                ("compat_flags", ctypes.c_uint64),                 # 3.17 on
                ("_reserved", ctypes.c_uint64 * 2)]


class FuseBuf(ctypes.Structure):
    """struct fuse_buf; ``mem_size`` from 3.17 on (libfuse reads it only for memory it
    allocated itself: zero here)."""
    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", ctypes.c_void_p),
                ("fd", ctypes.c_int), ("pos", ctypes.c_int64),
                ("mem_size", ctypes.c_size_t)]                     # 3.17 on


class FuseBufvec(ctypes.Structure):
    """struct fuse_bufvec with one buffer (``buf[1]`` in C)."""
    _fields_ = [("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t),
                ("buf", FuseBuf * 1)]


class ForgetData(ctypes.Structure):
    """struct fuse_forget_data: one inode of a FORGET of several."""
    _fields_ = [("ino", ctypes.c_uint64), ("nlookup", ctypes.c_uint64)]


class FuseCtx(ctypes.Structure):
    """struct fuse_ctx: who sent a request."""
    _fields_ = [("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32), ("pid", ctypes.c_int32),
                ("umask", ctypes.c_uint32)]


# fuse_lowlevel.h: which attributes a SETATTR sets
FUSE_SET_ATTR_MODE, FUSE_SET_ATTR_UID, FUSE_SET_ATTR_GID, FUSE_SET_ATTR_SIZE = 1, 2, 4, 8


class FuseArgs(ctypes.Structure):
    _fields_ = [("argc", ctypes.c_int), ("argv", ctypes.POINTER(ctypes.c_char_p)),
                ("allocated", ctypes.c_int)]


# struct fuse_lowlevel_ops: function pointers in this order (fuse_lowlevel.h, 3.0 to 3.18;
# later versions only append: 3.18 added tmpfile and statx).  A slot left NULL is answered by libfuse itself.
OPS_SLOTS = ("init destroy lookup forget getattr setattr readlink mknod mkdir unlink rmdir "
             "symlink rename link open read write flush release fsync opendir readdir "
             "releasedir fsyncdir statfs setxattr getxattr listxattr removexattr access create "
             "getlk setlk bmap ioctl poll write_buf retrieve_reply forget_multi flock fallocate "
             "readdirplus copy_file_range lseek").split()

req_t, ino_t, fi_p = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p
# fuse_interrupt_func_t: called once the kernel interrupts a request (its caller got a signal)
INTERRUPT_FUNC = ctypes.CFUNCTYPE(None, req_t, ctypes.c_void_p)
CALLBACK_TYPES = {
    "init": ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ConnInfo)),
    "lookup": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p),
    # the kernel lets go of lookups of an inode (nlookup of them; several inodes at once)
    "forget": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_uint64),
    "forget_multi": ctypes.CFUNCTYPE(None, req_t, ctypes.c_size_t, ctypes.c_void_p),
    "getattr": ctypes.CFUNCTYPE(None, req_t, ino_t, fi_p),
    "open": ctypes.CFUNCTYPE(None, req_t, ino_t, fi_p),
    "opendir": ctypes.CFUNCTYPE(None, req_t, ino_t, fi_p),
    "read": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_size_t, ctypes.c_int64, fi_p),
    "readdir": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_size_t, ctypes.c_int64, fi_p),
    "readdirplus": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_size_t, ctypes.c_int64, fi_p),
    "statfs": ctypes.CFUNCTYPE(None, req_t, ino_t),
    "getxattr": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p, ctypes.c_size_t),
    "listxattr": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_size_t),
    # an editable mount's (--edits): writes, new files, removals, renames
    "setattr": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_void_p, ctypes.c_int, fi_p),
    "unlink": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p),
    "rmdir": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p),
    "rename": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p, ino_t, ctypes.c_char_p,
                               ctypes.c_uint),
    "write": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_int64, fi_p),
    "flush": ctypes.CFUNCTYPE(None, req_t, ino_t, fi_p),
    "fsync": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_int, fi_p),
    "release": ctypes.CFUNCTYPE(None, req_t, ino_t, fi_p),
    "create": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p, ctypes.c_uint32, fi_p),
    "setxattr": ctypes.CFUNCTYPE(None, req_t, ino_t, ctypes.c_char_p, ctypes.c_void_p,
                                 ctypes.c_size_t, ctypes.c_int),
}


class LoopConfig32(ctypes.Structure):         # struct fuse_loop_config before 3.12
    _fields_ = [("clone_fd", ctypes.c_int), ("max_idle_threads", ctypes.c_uint)]
