"""The words h5pack's options take, in one import-light module (no numpy, h5py or PIL).

Each choice is a ``Literal`` with the tuple of its values; the modules acting on them
re-export both and the CLI builds its ``click.Choice`` lists from the tuples.
"""

from __future__ import annotations

from typing import Literal, get_args

# The format (core.format): decoded pixels or the files' bytes; one array or a byte blob.
Mode = Literal["raw", "encoded"]
Storage = Literal["array", "blob"]
MODES: tuple[Mode, ...] = get_args(Mode)
STORAGES: tuple[Storage, ...] = get_args(Storage)

# Chunks and filters (core.layout).
CODECS = ("none", "gzip", "lzf", "lz4", "zstd", "blosc-lz4", "blosc-zstd")
SHUFFLES = ("none", "byte", "bit")
LAYOUTS = ("chunked", "contiguous")

# Decoding (core.decode).
Backend = Literal["pillow", "opencv"]
ResizeMethod = Literal["stretch", "crop", "pad"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
RESIZE_METHODS: tuple[ResizeMethod, ...] = get_args(ResizeMethod)
CHANNELS: tuple[int, ...] = (1, 3)

# Conversion (write.options): "auto" chooses the mode from the images, and the layout
# (``write.plan.resolved_layout``).
ModeChoice = Literal["auto", "raw", "encoded"]
MODE_CHOICES: tuple[ModeChoice, ...] = get_args(ModeChoice)
LayoutChoice = Literal["auto", "chunked", "contiguous"]
LAYOUT_CHOICES: tuple[LayoutChoice, ...] = get_args(LayoutChoice)

# Training (read.boxes, training).
Crop = Literal["random-resized", "center", "resize"]
CROPS: tuple[str, ...] = get_args(Crop)
Output = Literal["tensor", "hwc", "pil"]
OUTPUTS: tuple[str, ...] = get_args(Output)
COLLATES = ("stack", "list", "padded")

# Benchmarks (bench.access): the access patterns read through the h5pack loader.
Pattern = Literal["random", "chunk", "sequential"]
PATTERNS: tuple[Pattern, ...] = get_args(Pattern)
