"""The mount: the tree of views a model is served as, the adapter that serves it through
``tensorfs.fuse``, and the daemon's life.  Above loading/ and facts/; nothing below imports it.
"""
