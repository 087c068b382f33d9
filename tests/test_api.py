"""The package's public names: every one resolves, and the light ones do not import torch."""

import subprocess
import sys

import h5pack


def test_every_public_name_resolves() -> None:
    for name in h5pack.__all__:
        assert getattr(h5pack, name) is not None, name


def test_packing_names_do_not_import_torch() -> None:
    code = (
        "import sys, h5pack\n"
        "h5pack.convert, h5pack.ConvertOptions, h5pack.Compression, h5pack.pack_info\n"
        "h5pack.packset_info, h5pack.verify_packset\n"
        "h5pack.convert_set, h5pack.convert_on_dask\n"
        "assert 'distributed' not in sys.modules, 'distributed was imported'\n"
        "h5pack.OptionsError, h5pack.FormatError\n"
        "h5pack.merge_packs, h5pack.MergeReport\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
