"""numpy and gguf, imported the first time under one process-wide lock: the only way
tensorfs imports them (``tests/project/test_libraries.py`` checks that no other module does).

    from tensorfs.runtime.libraries import np      # where numpy is first needed
    from tensorfs.runtime.libraries import gguf    # gguf-py, with numpy whole before it

On a path taken per request, ``from tensorfs.runtime import libraries`` once and
``libraries.np`` in the call: the from-import statement also looks up this module's
``__path__``, which ``__getattr__`` answers with an AttributeError (~3 us each time).

A mount does not import numpy (docs/internals/copylimit.md: it is most of the mount command's
imports); the first request that needs it does, on one of libfuse's threads, while others
may be importing it too.  Python's import locks are per module: a thread that imports a
submodule (``numpy.lib.format``) while another is inside ``import numpy`` can meet it in a
cycle, which Python breaks by handing one of them a partly initialised module (``ImportError:
cannot import name 'pad'``, then numpy broken for the process).  Here the first import of
numpy, and of gguf (which imports numpy and has submodules of its own), runs whole under
one lock before any caller gets the module; after that the names are plain globals of this
module.  For annotations, ``if TYPE_CHECKING: import numpy as np`` is fine (nothing runs).
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:              # what the type checker sees; at run time __getattr__ below
    import gguf
    import numpy as np

__all__ = ["np", "gguf"]

_MODULES = {"np": "numpy", "gguf": "gguf"}
_lock = threading.Lock()


def __getattr__(name: str):
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _lock:
        value = globals().get(name)
        if value is None:
            importlib.import_module("numpy")    # numpy whole first: gguf imports it too
            value = importlib.import_module(module)
            globals()[name] = value           # from now on a plain global: no lock
    return value

