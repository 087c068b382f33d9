"""The version of h5pack (written into every pack it makes)."""

__version__ = "0.1.0"
