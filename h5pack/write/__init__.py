"""Writing a pack: scan a folder, plan the storage, decode and compress in a pool, publish.

Built on ``h5pack.core``; ``convert`` and ``write_arrays`` are its public functions.
"""
