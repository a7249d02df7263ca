"""Every C structure tensorfs/fuse/abi.py declares with ctypes has the size, field offsets and
field sizes the C compiler gives it, for this machine's C library and the libfuse 3 headers:
the installed ones (libfuse3-dev, which `make test` installs), and 3.10.5, 3.17.2 and 3.18.2
from the tarballs in ../shared/libfuse/ where they are.  A wrong offset would not fail
loudly: the kernel would get wrong sizes or modes, or libfuse would ignore a flag."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import tarfile

import pytest

from tensorfs.fuse import abi
from tests.support.libfuse import SOURCES

# ctypes structure -> its C type; a ctypes field is the C member of the same name, and those
# starting with "_" are padding or bit fields, which C does not name.
STRUCTS = {
    abi.Timespec: "struct timespec",
    abi.Stat: "struct stat",
    abi.EntryParam: "struct fuse_entry_param",
    abi.Statvfs: "struct statvfs",
    abi.ConnInfo: "struct fuse_conn_info",
    abi.FuseArgs: "struct fuse_args",
    abi.LoopConfig32: "struct fuse_loop_config",   # as FUSE_USE_VERSION 31 sees it
    abi.FileInfo: "struct fuse_file_info",
    abi.FuseBuf: "struct fuse_buf",
    abi.FuseBufvec: "struct fuse_bufvec",
}
# Members the headers have only from some version on: (C type, member) -> minimum FUSE_VERSION.
SINCE = {("struct fuse_conn_info", name): 317
         for name in ("max_backing_stack_depth", "capable_ext", "want_ext")}
SINCE.update({("struct fuse_file_info", "backing_id"): 317,
              ("struct fuse_file_info", "compat_flags"): 317,
              ("struct fuse_buf", "mem_size"): 317})
# Structures that grew in 3.17 (into what was tail padding, or at the end): before, the C
# size is at most the ctypes one (libfuse reads no further than its own size).
GREW_IN_317 = {"struct fuse_file_info", "struct fuse_buf", "struct fuse_bufvec"}
# Bit fields of struct fuse_file_info written through FileInfo._bits: C sets each alone in
# a zeroed struct, and the word after ``flags`` must be the mask tensorfs uses.
FILE_INFO_BITS = {"keep_cache": abi.FI_KEEP_CACHE, "noflush": abi.FI_NOFLUSH}
BITS_SINCE = {"noflush": 312}
# Constants tensorfs copies from fuse_common.h: (C expression, value, since FUSE_VERSION).
CONSTANTS = {"FUSE_CAP_SPLICE_WRITE": (abi.FUSE_CAP_SPLICE_WRITE, 0),
             "FUSE_CAP_READDIRPLUS_AUTO": (abi.FUSE_CAP_READDIRPLUS_AUTO, 0),
             "FUSE_CAP_PASSTHROUGH": (abi.FUSE_CAP_PASSTHROUGH, 317),
             "FUSE_BUF_IS_FD": (abi.FUSE_BUF_IS_FD, 0),
             "FUSE_BUF_FD_SEEK": (abi.FUSE_BUF_FD_SEEK, 0),
             "FUSE_BACKING_STACKED_OVER": (abi.BACKING_STACKED_OVER, 317)}


def _program() -> str:
    lines = ["#define FUSE_USE_VERSION 31", "#include <stddef.h>", "#include <stdio.h>",
             "#include <string.h>", "#include <stdint.h>",
             "#include <sys/stat.h>", "#include <sys/statvfs.h>", "#include <fuse_lowlevel.h>",
             "#define M(T, m) printf(\"%s.%s|%zu|%zu\\n\", #T, #m, offsetof(T, m), "
             "sizeof(((T *)0)->m));",
             "int main(void) {"]
    for struct, ctype in STRUCTS.items():
        lines.append(f'printf("%s|%zu\\n", "{ctype}", sizeof({ctype}));')
        for name, *_ in struct._fields_:
            if name.startswith("_"):
                continue
            since = SINCE.get((ctype, name))
            if since:
                lines.append(f"#if FUSE_VERSION >= {since}")
            lines.append(f"M({ctype}, {name})")
            if since:
                lines.append("#endif")
    for name in abi.OPS_SLOTS:
        lines.append(f"M(struct fuse_lowlevel_ops, {name})")
    for name in FILE_INFO_BITS:
        since = BITS_SINCE.get(name, 0)
        lines += [f"#if FUSE_VERSION >= {since}", "{ struct fuse_file_info fi; uint32_t w;",
                  f"memset(&fi, 0, sizeof fi); fi.{name} = 1;",
                  "memcpy(&w, (char *)&fi + sizeof(fi.flags), 4);",
                  f'printf("bit.{name}|%u\\n", w); }}', "#endif"]
    for name, (_, since) in CONSTANTS.items():
        lines += [f"#if FUSE_VERSION >= {since}",
                  f'printf("const.{name}|%llu\\n", (unsigned long long)({name}));', "#endif"]
    lines += ['printf("FUSE_VERSION|%d\\n", FUSE_VERSION);', "return 0; }"]
    return "\n".join(lines) + "\n"


def _c_layout(tmp_path, cflags: list[str]) -> dict[str, tuple[int, ...]]:
    source, binary = tmp_path / "layout.c", tmp_path / "layout"
    source.write_text(_program())
    subprocess.run(["cc", *cflags, "-o", str(binary), str(source)], check=True,
                   capture_output=True, text=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    layout = {}
    for line in out.splitlines():
        key, *numbers = line.split("|")
        layout[key] = tuple(int(n) for n in numbers)
    return layout


def _check(layout: dict) -> None:
    version = layout["FUSE_VERSION"][0]
    for struct, ctype in STRUCTS.items():
        if ctype in GREW_IN_317 and version < 317:
            assert layout[ctype][0] <= ctypes.sizeof(struct), ctype
        else:
            assert layout[ctype] == (ctypes.sizeof(struct),), ctype
        for name, *_ in struct._fields_:
            if name.startswith("_") or SINCE.get((ctype, name), 0) > version:
                continue
            field = getattr(struct, name)
            if ctype in GREW_IN_317 and version < 317:      # buf[1]: a smaller fuse_buf
                offset, size = layout[f"{ctype}.{name}"]
                assert offset == field.offset and size <= field.size, f"{ctype}.{name}"
                continue
            assert layout[f"{ctype}.{name}"] == (field.offset, field.size), f"{ctype}.{name}"
    for name, mask in FILE_INFO_BITS.items():
        if version >= BITS_SINCE.get(name, 0):
            assert layout[f"bit.{name}"] == (mask,), name
    for name, (value, since) in CONSTANTS.items():
        if version >= since:
            assert layout[f"const.{name}"] == (value,), name
    pointer = ctypes.sizeof(ctypes.c_void_p)
    for index, name in enumerate(abi.OPS_SLOTS):
        assert layout[f"struct fuse_lowlevel_ops.{name}"] == (index * pointer, pointer), name


def _need_cc():
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc): `make test` installs gcc")


def test_the_installed_headers(tmp_path):
    _need_cc()
    flags = subprocess.run(["pkg-config", "--cflags", "fuse3"], capture_output=True, text=True) \
        if shutil.which("pkg-config") else None
    if flags is None or flags.returncode != 0:
        pytest.skip("no libfuse 3 headers (pkg-config fuse3): `make test` installs libfuse3-dev")
    _check(_c_layout(tmp_path, flags.stdout.split()))


@pytest.mark.parametrize("version", ["3.10.5", "3.17.2", "3.18.2"])
def test_the_upstream_headers(tmp_path, version):
    _need_cc()
    tarball = SOURCES / f"fuse-{version}.tar.gz"
    if not tarball.exists():
        pytest.skip(f"no {tarball} (../shared/libfuse/ beside the clone)")
    with tarfile.open(tarball) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(f"fuse-{version}/include/")]
        tar.extractall(tmp_path, members=members, filter="data")
    include = tmp_path / f"fuse-{version}" / "include"
    # Made by meson from 3.17 on: the version numbers, and nothing a layout depends on.
    major, minor, hotfix = version.split(".")
    (include / "libfuse_config.h").write_text(
        f"#define FUSE_MAJOR_VERSION {major}\n#define FUSE_MINOR_VERSION {minor}\n"
        f"#define FUSE_HOTFIX_VERSION {hotfix}\n")
    layout = _c_layout(tmp_path, [f"-I{include}"])
    assert layout["FUSE_VERSION"] == (int(major) * 100 + int(minor),)
    _check(layout)
