"""files/ of a directory model serves its subfolders (issue 38): sentence-transformers keeps
1_Pooling/config.json and 2_Normalize/ beside modules.json, so SentenceTransformer(MNT/files)
loads only if they are there.  Each file in a subfolder is under the rules of a top-level
one: its own owner and mode (read-only), a link only to a file inside the directory, hidden
names and links to folders left out."""

from __future__ import annotations

import gc
import os
import stat

import numpy as np
import pytest
from safetensors.numpy import save_file

import tensorfs


def _directory(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    save_file({"w": np.arange(4, dtype=np.float32)}, str(d / "model.safetensors"))
    (d / "modules.json").write_text("[]\n")
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text('{"word_embedding_dimension": 4}\n')
    (d / "2_Normalize").mkdir()                                  # empty, as older saves leave it
    (d / "3_Dense" / "deeper").mkdir(parents=True)
    (d / "3_Dense" / "deeper" / "weights.bin").write_bytes(os.urandom(5000))
    private = d / "1_Pooling" / "private.json"
    private.write_text("{}\n")
    private.chmod(0o600)
    (d / ".git" / "objects").mkdir(parents=True)
    (d / ".git" / "config").write_text("[core]\n")
    (d / "1_Pooling" / ".hidden").write_text("x\n")
    outside = tmp_path / "secret.txt"
    outside.write_text("not the model's\n")
    os.symlink(outside, d / "1_Pooling" / "planted.txt")        # a link out: refused
    os.symlink("config.json", d / "1_Pooling" / "alias.json")    # a link inside: served
    os.symlink(tmp_path, d / "linked_dir")                       # a link to a folder: left out
    return d


def test_subfolders_are_served_under_the_top_level_rules(tmp_path, mount):
    d = _directory(tmp_path)
    log = tmp_path / "daemon.log"
    mnt = mount(d, "--log", log)
    files = mnt / "files"
    assert sorted(os.listdir(files)) == ["1_Pooling", "2_Normalize", "3_Dense",
                                         "model.safetensors", "modules.json"]
    assert sorted(os.listdir(files / "1_Pooling")) == ["alias.json", "config.json",
                                                       "private.json"]
    assert os.listdir(files / "2_Normalize") == []
    assert stat.S_ISDIR(os.stat(files / "2_Normalize").st_mode)
    for rel in ("1_Pooling/config.json", "1_Pooling/alias.json", "3_Dense/deeper/weights.bin"):
        assert (files / rel).read_bytes() == (d / rel).read_bytes(), rel
    served, source = os.stat(files / "1_Pooling" / "private.json"), os.stat(
        d / "1_Pooling" / "private.json")
    assert served.st_mode & 0o777 == 0o400                     # its own mode, read-only
    assert (served.st_uid, served.st_gid) == (source.st_uid, source.st_gid)
    assert "planted.txt: not served in files/" in log.read_text()
    with tensorfs.open(d) as m:
        assert "1_Pooling/config.json" in m.files
        assert m.read_file("3_Dense/deeper/weights.bin") == (d / "3_Dense/deeper/weights.bin"
                                                            ).read_bytes()


@pytest.mark.clients
def test_sentence_transformer_loads_from_the_mount(tmp_path, mount):
    """A sentence-transformers model whose weights are a pytorch_model.bin: loaded from
    MNT/files (the composed model.safetensors, 1_Pooling/, 2_Normalize/), its embeddings
    equal the original directory's."""
    pytest.importorskip("sentence_transformers")
    torch = pytest.importorskip("torch")
    from sentence_transformers import SentenceTransformer

    from tests.support.pytorch_models import write_sentence_transformer

    d = write_sentence_transformer(tmp_path / "st")
    for extra in (d / "2_Normalize").iterdir():                 # as older saves left it
        extra.unlink()
    mnt = mount(d)
    assert os.listdir(mnt / "files" / "2_Normalize") == []
    sentences = ["the cat sat on the mat", "a dog ran far away"]
    model = SentenceTransformer(str(mnt / "files"), device="cpu")
    ours = model.encode(sentences, convert_to_tensor=True)
    del model                       # its memory maps of MNT/files: gone before the unmount
    gc.collect()
    theirs = SentenceTransformer(str(d), device="cpu").encode(sentences, convert_to_tensor=True)
    assert torch.equal(ours, theirs)
