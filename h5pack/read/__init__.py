"""Reading a pack: samples grouped by chunk (``PackReader``) and the direct chunk path.

Built on ``h5pack.core``; knows nothing of PyTorch.
"""
