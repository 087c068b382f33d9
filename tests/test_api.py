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
        "h5pack.merge_packs, h5pack.MergeReport, h5pack.open, h5pack.Pack\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_type_checkers_see_every_lazy_name() -> None:
    # The lazily exported names are Any to a type checker unless the TYPE_CHECKING block
    # imports them too (issue 16.5: four of them were missing).
    import ast
    from pathlib import Path

    tree = ast.parse(Path(h5pack.__file__).read_text())
    checked: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.module:
                    checked.update((a.name, statement.module) for a in statement.names)
    lazy = h5pack._LAZY
    assert set(lazy) <= set(checked), sorted(set(lazy) - set(checked))
    for name in lazy:  # and from where the package imports it
        assert getattr(__import__(checked[name], fromlist=[name]), name) is getattr(h5pack, name)


def test_the_package_is_marked_typed() -> None:
    from pathlib import Path

    assert (Path(h5pack.__file__).parent / "py.typed").is_file()  # PEP 561
