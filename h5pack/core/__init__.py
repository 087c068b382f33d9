"""The on-disk format and its arithmetic: names and versions, chunk layout and filters, decoding.

Imported by every layer above; imports nothing of h5pack but ``errors`` and ``_types``.
"""
