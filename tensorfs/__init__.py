"""tensorfs: mount safetensors, GGUF and PyTorch model files as a tree of tensors (editable with --edits).

The library API (``tensorfs.open``, ``tensorfs.ModelError``: docs/reference/api.md) is imported on
first use: the command line imports this package, and must not pay for numpy and the
parsers before it knows it needs them.
"""

__version__ = "0.1.0"

__all__ = ["open", "ModelError", "__version__"]

_LAZY = {"open": "tensorfs.api", "OpenModel": "tensorfs.api", "ModelError": "tensorfs.errors"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tensorfs' has no attribute {name!r}")
    import importlib  # only when a lazy name is first used: `import tensorfs` stays light

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
