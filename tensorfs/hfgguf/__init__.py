"""A Hugging Face model directory served as the GGUF files llama.cpp's converter would write
(docs/reference/hf-gguf.md).

``tensorfs.hfgguf.convert`` says, from config.json, the tokenizer files and the tensors'
names, types and shapes, what ``convert_hf_to_gguf.py`` (the one vendored in
llama-cpp-python 0.3.36) writes for ``--outtype`` the source's own float type and
``q8_0``: the metadata in its order and types (gguf-py's own ``GGUFWriter`` and
``Metadata`` make them, as in the converter), the tensors in its order with its names,
types and shapes, and how each tensor's bytes come from the source's; or, in one line, why
it would not write one (``NoGguf``).  ``tensorfs.hfgguf.served`` composes the file without
a copy: the header made here, the tensors whose bytes are the source's as byte ranges of
it, the rest computed on read (``tensorfs.hfgguf.vocab``: the tokenizer's fields).
"""
