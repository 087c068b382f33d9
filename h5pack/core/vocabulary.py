"""The words h5pack's options take, in one import-light module (no numpy, h5py or PIL).

Every choice a user names (a mode, a codec, a decoder, a crop...) is a ``Literal`` here with
the tuple of its values; the modules that act on them re-export both under the same names
(``core.format.Mode``, ``core.layout.CODECS``, ``core.decode.Backend``...), and the command
line builds its ``click.Choice`` lists from these tuples instead of copying them (issue
16.3: the CLI copied them because the Literals lived in modules that import PIL). A new
choice is added here, once. The flag spellings stay in ``cli/flags.py``: the library
names parameters, the command line names flags.
"""

from __future__ import annotations

from typing import Literal, get_args

# -- the format (core.format) --------------------------------------------------------------
# What a pack stores: decoded pixels or the image files' bytes.
Mode = Literal["raw", "encoded"]
# How the images dataset holds them: one (N, H, W, C) array, or a flat byte blob + offsets.
Storage = Literal["array", "blob"]
MODES: tuple[Mode, ...] = get_args(Mode)
STORAGES: tuple[Storage, ...] = get_args(Storage)

# -- chunks and filters (core.layout) ------------------------------------------------------
Codec = Literal["none", "gzip", "lzf", "lz4", "zstd", "blosc-lz4", "blosc-zstd"]
Shuffle = Literal["none", "byte", "bit"]
# How the images dataset is stored: in chunks (filters possible) or in one contiguous run.
Layout = Literal["chunked", "contiguous"]
CODECS: tuple[Codec, ...] = get_args(Codec)
SHUFFLES: tuple[Shuffle, ...] = get_args(Shuffle)
LAYOUTS: tuple[Layout, ...] = get_args(Layout)

# -- decoding (core.decode) ----------------------------------------------------------------
Backend = Literal["pillow", "opencv"]
ResizeMethod = Literal["stretch", "crop", "pad"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
RESIZE_METHODS: tuple[ResizeMethod, ...] = get_args(ResizeMethod)
CHANNELS: tuple[int, ...] = (1, 3)

# -- conversion (write.options) ------------------------------------------------------------
# The storage mode asked for: a pack's mode, or "auto" to choose it from the images.
ModeChoice = Literal["auto", "raw", "encoded"]
MODE_CHOICES: tuple[ModeChoice, ...] = get_args(ModeChoice)
# The layout asked for: a dataset layout, or "auto": contiguous for an uncompressed blob,
# chunked otherwise (``write.plan.resolved_layout``).
LayoutChoice = Literal["auto", "chunked", "contiguous"]
LAYOUT_CHOICES: tuple[LayoutChoice, ...] = get_args(LayoutChoice)

# -- training (read.boxes, training) -------------------------------------------------------
Crop = Literal["random-resized", "center", "resize"]
CROPS: tuple[str, ...] = get_args(Crop)
Output = Literal["tensor", "hwc", "pil"]
OUTPUTS: tuple[str, ...] = get_args(Output)
Collate = Literal["stack", "list", "padded"]
COLLATES: tuple[str, ...] = get_args(Collate)

# -- benchmarks (bench.access) -------------------------------------------------------------
# The access patterns read through the h5pack loader.
Pattern = Literal["random", "chunk", "sequential"]
PATTERNS: tuple[Pattern, ...] = ("random", "chunk", "sequential")
