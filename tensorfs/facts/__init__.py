"""Tensor facts: ``tensorfs hash``, ``stats`` and ``diff`` computed over the library API.
Above the API; knows nothing of FUSE.
"""
