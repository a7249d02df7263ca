"""The ``-o`` allow-list (tensorfs/fuse/options.py, docs/reference/cli.md): parsed once into one typed
value, every allowed option mounts on the libfuse in use (tests/fuse/test_libfuse_matrix.py runs
this file against 3.10.5, 3.17.2 and 3.18.2), and what the kernel shows is what was asked."""

from __future__ import annotations

import os

import pytest

from tensorfs.fuse import options as mountoptions
from tensorfs.fuse.options import MAX_READ_LIMIT, MountOptions, OptionError, parse
from tests.support.models import write_safetensors

IS_ROOT = os.geteuid() == 0


def _kernel_options(mnt) -> set[str]:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == str(mnt):
                return set(fields[5].split(","))
    raise AssertionError(f"{mnt} is not mounted")


def test_every_allowed_option_has_an_example_that_the_mount_tests_use():
    """A new allowed option is mounted by the test below, on every libfuse of the matrix."""
    named = {example.partition("=")[0] for example in mountoptions.EXAMPLES}
    assert named == set(mountoptions._FLAGS) | set(mountoptions._NUMBERS) | {"fsname"}


@pytest.mark.parametrize("option", mountoptions.EXAMPLES)
def test_every_allowed_option_mounts_and_serves(tmp_path, mount, option):
    if option == "allow_root" and not IS_ROOT:
        pytest.skip("allow_root needs user_allow_other for a non-root user")
    if option == "allow_other" and not IS_ROOT:
        pytest.skip("allow_other needs user_allow_other for a non-root user")
    model = tmp_path / "m.safetensors"
    tensors = write_safetensors(model)
    mnt = mount(model, "-o", option)
    assert (mnt / "lm_head" / "weight").read_bytes() == tensors["lm_head.weight"].tobytes()
    shown = _kernel_options(mnt.resolve())
    assert {"ro", "nosuid", "nodev"} <= shown
    assert ("noexec" in shown) == (option == "noexec")
    assert ("noatime" in shown) == (option == "noatime")


@pytest.mark.parametrize("texts,noatime,noexec", [
    (["noatime,atime"], False, False), (["atime", "noatime"], True, False),
    (["noexec,exec"], False, False), (["exec,noexec"], False, True)])
def test_of_two_contradicting_options_the_last_counts(texts, noatime, noexec):
    options = parse(texts)
    assert (options.noatime, options.noexec) == (noatime, noexec)
    given = options.libfuse_options()
    assert ("noatime" in given) == noatime and ("noexec" in given) == noexec
    assert "atime" not in given and "exec" not in given      # libfuse 3.17 refuses atime


def test_libfuse_is_given_read_only_no_devices_and_the_type_whatever_was_asked():
    given = parse(["allow_other,dev,suid,fsname=x,max_read=4096"]).libfuse_options()
    assert given[:6] == ["ro", "nodev", "nosuid", "default_permissions", "fsname=x",
                         "subtype=tensorfs"]
    assert "dev" not in given and "suid" not in given and "max_read=4096" in given
    assert parse([], fsname="tensorfs:m").libfuse_options()[4] == "fsname=tensorfs:m"


@pytest.mark.parametrize("value", ["1", "4096", str(MAX_READ_LIMIT)])
def test_max_read_one_rule_accepts(value):
    assert parse([f"max_read={value}"]).max_read == int(value)


@pytest.mark.parametrize("value", ["0", "+5", " 5", "0x10", "1e3", "1_000", "-1", "",
                                   str(MAX_READ_LIMIT + 1), "9" * 30, "٣"])
def test_max_read_one_rule_refuses(value):
    with pytest.raises(OptionError, match=r"-o max_read=.*: (max_read takes a whole number "
                       r"of bytes from 1 to|a backslash, comma, space)"):
        parse([f"max_read={value}"])


def test_defaults():
    assert parse([]) == MountOptions()
    assert MountOptions().attr_timeout == MountOptions().entry_timeout == 86400
    assert parse(["nothreads"]).threads is False
