"""A copy of a mount's directory behaves like a copy: a normal user who ``cp -r``s a part of
the mount can remove the copy again, while the mount itself stays read-only (EROFS)."""

from __future__ import annotations

import os

from tests.support import run_tensorfs
from tests.support.models import write_safetensors
from tests.support.users import needs_users


@needs_users
def test_a_user_removes_the_copy_of_a_mounted_directory(users, shared_dir):
    user, _ = users
    model = shared_dir / "m.safetensors"
    write_safetensors(model)
    model.chmod(0o644)
    mnt = shared_dir / "mnt"
    mnt.mkdir()
    home = shared_dir / "home"
    home.mkdir()
    os.chown(home, user.uid, user.uid)
    assert run_tensorfs("mount", model, mnt, "-o", "allow_other").returncode == 0
    try:
        assert os.stat(mnt / "model" / "layers").st_mode & 0o777 == 0o755
        copy = home / "copy"
        copied = user.run("cp", "-r", mnt / "model", copy)
        assert copied.returncode == 0, copied.stderr
        assert (copy / "layers" / "0").is_dir()
        removed = user.run("rm", "-rf", copy)
        assert removed.returncode == 0 and not copy.exists(), removed.stderr
        # the mount is still read-only to that user: refused by the kernel with EROFS
        for attempt in (["mkdir", mnt / "model" / "x"], ["touch", mnt / "model" / "x"],
                        ["rm", "-rf", mnt / "model" / "layers"]):
            refused = user.run(*attempt)
            assert refused.returncode != 0 and "Read-only file system" in refused.stderr, attempt
    finally:
        assert run_tensorfs("unmount", mnt).returncode == 0
