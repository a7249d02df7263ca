"""The libfuse 3 binding: the C structures, the loader of libfuse, the session that answers
the kernel's requests, the ``Operations`` a filesystem implements for it and the mount's
``-o`` options.  It knows nothing of what a mount serves; only the core lies below it.
"""
