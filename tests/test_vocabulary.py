"""h5pack.core.vocabulary: every choice named once, light to import, used by the CLI."""

from __future__ import annotations

import subprocess
import sys

import click

from h5pack.core import vocabulary as words


def test_importing_the_vocabulary_imports_no_numpy_h5py_or_pil() -> None:
    code = (
        "import sys, h5pack.core.vocabulary\n"
        "heavy = [m for m in ('numpy', 'h5py', 'PIL', 'torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_modules_that_act_on_a_choice_re_export_the_same_one() -> None:
    from h5pack.bench import access
    from h5pack.core import decode, layout
    from h5pack.core import format as fmt
    from h5pack.read import boxes
    from h5pack.training import dataset, loader
    from h5pack.write import options

    pairs = [
        (fmt.MODES, words.MODES),
        (fmt.STORAGES, words.STORAGES),
        (layout.CODECS, words.CODECS),
        (layout.SHUFFLES, words.SHUFFLES),
        (decode.BACKENDS, words.BACKENDS),
        (decode.RESIZE_METHODS, words.RESIZE_METHODS),
        (boxes.CROPS, words.CROPS),
        (options.MODE_CHOICES, words.MODE_CHOICES),
        (options.LAYOUT_CHOICES, words.LAYOUT_CHOICES),
        (dataset.OUTPUTS, words.OUTPUTS),
        (loader.COLLATES, words.COLLATES),
        (access.PATTERNS, words.PATTERNS),
    ]
    assert all(there is here for there, here in pairs)
    assert ("auto", *words.MODES) == words.MODE_CHOICES
    assert ("auto", *words.LAYOUTS) == words.LAYOUT_CHOICES


def test_the_command_line_offers_the_vocabulary() -> None:
    from h5pack.cli.main import cli

    convert = cli.get_command(click.Context(cli), "convert")
    assert convert is not None
    choices = {
        p.name: tuple(p.type.choices) for p in convert.params if isinstance(p.type, click.Choice)
    }
    assert choices["mode"] == words.MODE_CHOICES
    assert choices["layout"] == words.LAYOUT_CHOICES
    assert choices["backend"] == words.BACKENDS
    assert choices["resize"] == words.RESIZE_METHODS
    assert choices["compression"] == words.CODECS
    assert choices["channels"] == tuple(str(c) for c in words.CHANNELS)
