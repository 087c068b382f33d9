"""The PyTorch side: datasets, chunk-aware samplers, ``make_loader`` and device prefetch.

The only layer that imports torch (with the bench code that drives a loader).
"""
