"""Semantic masks beside an image folder: values kept pixel for pixel, 255 included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from h5pack import ConvertOptions, PackReader, convert
from h5pack.cli.main import cli
from h5pack.errors import DecodeError
from h5pack.write.sources import MaskSource, sample_source


def _mask(shape: tuple[int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mask = rng.integers(0, 21, shape, dtype=np.uint8)
    mask[: shape[0] // 4] = 255  # ignore
    return mask


def make_segmentation(root: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """Images (JPEG, PNG, nested) and masks: palette PNG, grey PNG, mirrored paths."""
    images, masks = root / "images", root / "masks"
    expected = {}
    for i, (name, size) in enumerate(
        [("a.jpg", (40, 30)), ("b.png", (24, 32)), ("city/c.jpg", (33, 17)), ("city/d.png", (8, 8))]
    ):
        image = np.random.default_rng(i).integers(0, 256, (*size, 3), dtype=np.uint8)
        (images / name).parent.mkdir(parents=True, exist_ok=True)
        (masks / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(images / name)
        mask = _mask(size, i)
        stem = str(Path(name).with_suffix(".png"))
        if i % 2:
            Image.fromarray(mask, mode="L").save(masks / stem)
        else:
            paletted = Image.fromarray(mask, mode="P")
            paletted.putpalette(np.random.default_rng(9).integers(0, 256, 768).tolist())
            paletted.save(masks / stem)
        expected[name] = mask
    return images, masks, expected


@pytest.mark.parametrize("workers", [1, 2])
def test_masks_equal_their_files_pixel_for_pixel(tmp_path, workers):
    images, masks, expected = make_segmentation(tmp_path)
    with Image.open(masks / "a.png") as palette:
        assert palette.mode == "P"  # the values, not the colours, are kept
    report = convert(MaskSource(images, masks), tmp_path / "s.h5", ConvertOptions(workers=workers))
    assert report.num_samples == 4
    assert not report.skipped
    with PackReader(tmp_path / "s.h5") as reader:
        keys = list(reader.paths)
        stored = reader.read_fields(range(4), ["mask"])["mask"]
    assert sorted(keys) == sorted(expected)
    for key, mask in zip(keys, stored, strict=True):
        assert mask.dtype == np.uint8
        np.testing.assert_array_equal(mask, expected[key])


def test_bad_pairs_are_skipped_naming_the_image_or_stop_with_strict(tmp_path):
    images, masks, _ = make_segmentation(tmp_path)
    Image.fromarray(np.zeros((9, 8), np.uint8)).save(masks / "city" / "d.png")  # one row more
    Image.fromarray(np.zeros((30, 40, 3), np.uint8)).save(masks / "a.png")  # RGB
    Image.fromarray(np.zeros((5, 5, 3), np.uint8)).save(images / "lonely.png")
    Image.fromarray(np.zeros((5, 5), np.uint8)).save(masks / "orphan.png")
    report = convert(sample_source(images, masks=masks), tmp_path / "p.h5")
    assert {s.path: s.reason for s in report.skipped} == {
        "a.jpg": "its mask is a RGB image, not a palette (P) or grey (L) one",
        "city/d.png": "its mask's size differs from the image's",
        "lonely.png": "no mask of this stem",
    }
    assert report.num_samples == 2
    with pytest.raises(DecodeError, match=r"a\.jpg: its mask is a RGB image"):
        convert(MaskSource(images, masks), tmp_path / "q.h5", ConvertOptions(strict=True))
    assert not (tmp_path / "q.h5").exists()
    result = CliRunner().invoke(
        cli, ["convert", str(images), str(tmp_path / "r.h5"), "--masks", str(masks), "-q"]
    )
    assert result.exit_code == 0, result.output
    assert "packed 2 of 2 images" in result.output
    assert "city/d.png: its mask's size differs from the image's" in result.output
    assert "1 masks under" in result.output
    assert "orphan" in result.output
