"""Editing (``--edits DIR``): the edit store kept in DIR and the composer that builds the
edited model file from pieces, without copying tensor bytes.  Above formats/; knows nothing
of FUSE.
"""
