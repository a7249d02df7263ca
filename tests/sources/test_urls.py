"""The remote options of a named model (tensorfs.sources.urls): one check for every command, through
the real ``tensorfs`` command, and the settings and secrets the one owner derives."""

from __future__ import annotations

import subprocess

import pytest

from tensorfs.sources.remote import RemoteSettings
from tensorfs.sources.urls import command_line_secrets, option_problem, remote_settings
from tests.support import fuse_mounts_under, run_tensorfs, usage_error
from tests.support.models import write_safetensors


@pytest.mark.parametrize("command", [["inspect"], ["hash"], ["stats"], ["mount", "MNT"]])
def test_a_timeout_of_zero_is_refused_for_every_command(tmp_path, command):
    """Before, a mount or inspect of a local file took --timeout 0 without a word (only a URL
    checked it), while hash and stats refused it: now every command says the same line."""
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    (tmp_path / "mnt").mkdir()
    args = [str(tmp_path / "mnt") if a == "MNT" else a for a in command]
    result = run_tensorfs(args[0], model, *args[1:], "--timeout", "0")
    for mounted in fuse_mounts_under(tmp_path):        # a mount that went ahead: not left
        subprocess.run(["fusermount3", "-uz", mounted], check=False)
    line = usage_error(result)          # refused when parsed (cli.timeout_seconds)
    assert "--timeout" in line and "more than 0" in line, line


@pytest.mark.parametrize("command", [["inspect"], ["hash"], ["mount", "MNT"]])
def test_a_storage_option_for_a_local_file_is_refused_with_one_line(tmp_path, command):
    model = tmp_path / "m.safetensors"
    write_safetensors(model)
    (tmp_path / "mnt").mkdir()
    args = [str(tmp_path / "mnt") if a == "MNT" else a for a in command]
    result = run_tensorfs(args[0], model, *args[1:], "--storage-option", "anon=true")
    for mounted in fuse_mounts_under(tmp_path):
        subprocess.run(["fusermount3", "-uz", mounted], check=False)
    assert usage_error(result) == "tensorfs: error: --storage-option applies to a URL only"


def test_option_problems():
    assert option_problem(["m.gguf"]) is None
    assert option_problem(["s3://b/m.gguf"], storage_options=[("anon", True)]) is None
    assert option_problem(["m.gguf", "s3://b/m.gguf"], storage_options={"a": 1}) is None
    assert option_problem(["m.gguf"], disk_cache=("/tmp/c", 1), storage_options={"a": 1}) == \
        "--storage-option and --disk-cache apply to a URL only"
    assert option_problem(["s3://b/m"], timeout=-1.0) == "--timeout must be more than 0 seconds"


def test_remote_settings_only_for_a_url():
    assert remote_settings("m.gguf", storage_options={"a": 1}) is None
    settings = remote_settings("https://h/m.gguf", storage_options=[("anon", True)], timeout=5)
    assert isinstance(settings, RemoteSettings)
    assert settings.storage_options == {"anon": True} and settings.timeout == 5.0
    assert remote_settings("https://h/m.gguf").timeout == RemoteSettings().timeout


def test_command_line_secrets_are_every_urls_credentials_and_non_scalar_option_values():
    secrets = command_line_secrets(["https://user:pw@h/m.gguf?sig=x", "local.gguf"],
                                   ["true", "3", "s3cr3t"])
    assert set(secrets) == {"user:pw", "sig=x", "s3cr3t"}
