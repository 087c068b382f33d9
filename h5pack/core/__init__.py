"""The on-disk format and its arithmetic: names, chunk layout and filters, decoding."""
