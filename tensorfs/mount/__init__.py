"""The mount: the tree of views a model is served as, the FUSE binding and adapter, and the
daemon's life.  Above loading/ and facts/; nothing below imports it.
"""
