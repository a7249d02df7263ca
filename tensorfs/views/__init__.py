"""Views: the byte views a file of the mount can be (a tensor's raw bytes, its .npy, a
generated file) over a source, and the naming rule that places them in a tree.  Above
sources/; knows nothing of FUSE.
"""
