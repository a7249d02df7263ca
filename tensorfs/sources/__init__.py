"""Sources: where a model's bytes come from (a local file, a remote object through the block
cache) behind one interface, and the transports that fetch remote bytes.  Above formats/ and
convert/; knows nothing of the mount.
"""
