"""The ``h5pack`` command line: click commands, thin over the library's public functions."""
