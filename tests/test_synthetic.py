from __future__ import annotations

import importlib.util
import io
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image

from h5pack import synthetic as sample
from h5pack.errors import OptionsError, SourceError, TargetExistsError
from h5pack.synthetic import (
    SampleSpec,
    image_name,
    make_image_folder,
    photos_folder,
)
from tests.helpers import shared_photos

SHARED_PHOTOS = shared_photos()
needs_photos = pytest.mark.skipif(
    not SHARED_PHOTOS.is_dir(), reason="no real photographs in shared/data/photos"
)

TINY = SampleSpec(num_images=10, num_classes=3, size=(24, 32))


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def jpeg_kb(pixels: np.ndarray, quality: int = 90) -> float:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return len(buffer.getvalue()) / 1024


# --- determinism --------------------------------------------------------------------------


def test_same_spec_gives_byte_identical_files(tmp_path: Path) -> None:
    first = make_image_folder(tmp_path / "a", TINY, photos=False)
    second = make_image_folder(tmp_path / "b", TINY, photos=False)
    assert read_tree(tmp_path / "a") == read_tree(tmp_path / "b")
    assert [p.relative_to(tmp_path / "a") for p in first] == [
        p.relative_to(tmp_path / "b") for p in second
    ]


def test_other_seed_gives_other_images(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "a", TINY, photos=False)
    make_image_folder(tmp_path / "b", replace(TINY, seed=1), photos=False)
    a, b = read_tree(tmp_path / "a"), read_tree(tmp_path / "b")
    assert a.keys() == b.keys()
    assert all(a[name] != b[name] for name in a)


def test_images_differ_from_each_other(tmp_path: Path) -> None:
    paths = make_image_folder(tmp_path, TINY, photos=False)
    assert len({p.read_bytes() for p in paths}) == len(paths)


def test_workers_write_the_same_files(tmp_path: Path) -> None:
    spec = SampleSpec(num_images=12, num_classes=2, size=(16, 20))
    done: list[int] = []
    make_image_folder(tmp_path / "serial", spec, photos=False)
    make_image_folder(tmp_path / "pool", spec, photos=False, workers=2, progress=done.append)
    assert read_tree(tmp_path / "serial") == read_tree(tmp_path / "pool")
    assert sum(done) == spec.num_images


def test_image_is_independent_of_num_images(tmp_path: Path) -> None:
    # Image i depends on (seed, i) only: growing a folder keeps its first images.
    make_image_folder(tmp_path / "small", SampleSpec(num_images=3, num_classes=3, size=(24, 32)))
    make_image_folder(tmp_path / "big", TINY)
    small, big = read_tree(tmp_path / "small"), read_tree(tmp_path / "big")
    assert all(big[name] == data for name, data in small.items())


# --- layout -------------------------------------------------------------------------------


def test_class_folders_and_labels(tmp_path: Path) -> None:
    paths = make_image_folder(tmp_path, TINY, photos=False)
    assert paths == sorted(paths)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["class_00", "class_01", "class_02"]
    counts = {d.name: len(list(d.iterdir())) for d in tmp_path.iterdir()}
    assert counts == {"class_00": 4, "class_01": 3, "class_02": 3}
    for path in paths:
        index = int(path.stem.removeprefix("img_"))
        assert path.parent.name == f"class_{index % TINY.num_classes:02d}"
        assert path.suffix == ".jpg"
    assert sorted(int(p.stem[4:]) for p in paths) == list(range(TINY.num_images))


def test_flat_writes_the_same_images_without_folders(tmp_path: Path) -> None:
    flat_spec = replace(TINY, flat=True)
    flat = make_image_folder(tmp_path / "flat", flat_spec, photos=False)
    make_image_folder(tmp_path / "classes", TINY, photos=False)
    assert all(p.parent == tmp_path / "flat" for p in flat)
    assert [p.name for p in flat] == [f"img_{i:06d}.jpg" for i in range(TINY.num_images)]
    by_name = {Path(k).name: v for k, v in read_tree(tmp_path / "classes").items()}
    assert read_tree(tmp_path / "flat") == by_name


def test_names_widen_for_many_classes_and_images() -> None:
    spec = SampleSpec(num_images=1_000_001, num_classes=150, size=(1, 1))
    assert image_name(spec, 0) == Path("class_000/img_0000000.jpg")
    assert image_name(spec, 1_000_000) == Path(f"class_{1_000_000 % 150:03d}/img_1000000.jpg")
    small = SampleSpec(num_images=5, num_classes=2, size=(1, 1), fmt="png")
    assert [image_name(small, i) for i in range(5)] == [
        Path(f"class_{i % 2:02d}/img_{i:06d}.png") for i in range(5)
    ]


def test_fewer_images_than_classes(tmp_path: Path) -> None:
    make_image_folder(tmp_path, SampleSpec(num_images=2, num_classes=5, size=(8, 8)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["class_00", "class_01"]


def test_png_format(tmp_path: Path) -> None:
    spec = replace(TINY, fmt="png")
    paths = make_image_folder(tmp_path, spec, photos=False)
    assert {p.suffix for p in paths} == {".png"}
    with Image.open(paths[0]) as image:
        assert image.format == "PNG"
        assert image.mode == "RGB"


def test_progress_counts_every_image(tmp_path: Path) -> None:
    done: list[int] = []
    make_image_folder(tmp_path, TINY, photos=False, progress=done.append)
    assert done == [1] * TINY.num_images


# --- sizes --------------------------------------------------------------------------------


def test_fixed_size_without_jitter(tmp_path: Path) -> None:
    for path in make_image_folder(tmp_path, TINY, photos=False):
        with Image.open(path) as image:
            assert image.format == "JPEG"
            assert image.mode == "RGB"
            assert image.size == (32, 24)  # PIL: (W, H)


def test_sizes_vary_within_bounds_with_jitter(tmp_path: Path) -> None:
    spec = SampleSpec(num_images=30, num_classes=3, size=(40, 60), size_jitter=0.25)
    sizes = set()
    for path in make_image_folder(tmp_path, spec, photos=False):
        with Image.open(path) as image:
            width, height = image.size
        assert 30 <= height <= 50
        assert 45 <= width <= 75
        sizes.add((height, width))
    assert len(sizes) > 20
    assert len({h for h, _ in sizes}) > 5
    assert len({w for _, w in sizes}) > 5


# --- where photographs come from ----------------------------------------------------------


def test_none_uses_synthetic_photographs(tmp_path: Path) -> None:
    # the package never looks for photographs outside itself
    assert photos_folder(None) is None
    make_image_folder(tmp_path / "none", TINY, photos=None)
    make_image_folder(tmp_path / "false", TINY, photos=False)
    assert read_tree(tmp_path / "none") == read_tree(tmp_path / "false")


def test_missing_photos_folder_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    with pytest.raises(SourceError, match="no-such-folder"):
        make_image_folder(tmp_path / "out", TINY, photos=missing)
    assert not (tmp_path / "out").exists()


def test_photos_folder_without_photographs_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("no photos here")
    with pytest.raises(SourceError, match="notes"):
        make_image_folder(tmp_path / "out", TINY, photos=tmp_path / "notes")


def test_unreadable_photograph_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(SourceError, match=r"broken\.jpg"):
        make_image_folder(tmp_path / "out", TINY, photos=tmp_path / "photos")


def test_own_photos_folder_is_used(tmp_path: Path) -> None:
    # A folder holding one flat grey photograph gives near-grey images (jitter aside).
    (tmp_path / "photos").mkdir()
    Image.new("RGB", (120, 90), (128, 128, 128)).save(tmp_path / "photos" / "grey.png")
    (tmp_path / "photos" / "notes.txt").write_text("ignored")
    assert photos_folder(tmp_path / "photos") == (tmp_path / "photos").resolve()
    for path in make_image_folder(tmp_path / "out", TINY, photos=tmp_path / "photos"):
        pixels = np.asarray(Image.open(path), dtype=np.float64)
        assert abs(pixels.mean() - 128) < 20
        assert pixels.std() < 8


def test_each_class_prefers_its_own_photos(tmp_path: Path) -> None:
    # Four flat photographs of distinct colours, four classes: class c is cut mostly from
    # photograph c (names sort as a, b, c, d), so classes look different.
    colours = np.array([(200, 40, 40), (40, 200, 40), (40, 40, 200), (128, 128, 128)])
    (tmp_path / "photos").mkdir()
    for name, colour in zip("abcd", colours, strict=True):
        Image.new("RGB", (80, 60), tuple(int(v) for v in colour)).save(
            tmp_path / "photos" / f"{name}.png"
        )
    spec = SampleSpec(num_images=80, num_classes=4, size=(12, 16))
    paths = make_image_folder(tmp_path / "out", spec, photos=tmp_path / "photos")
    own = 0
    for path in paths:
        mean = np.asarray(Image.open(path), dtype=np.float64).reshape(-1, 3).mean(axis=0)
        nearest = int(np.argmin(np.linalg.norm(colours - mean, axis=1)))
        own += nearest == int(path.parent.name.removeprefix("class_"))
    assert own / len(paths) > 0.7  # 0.8 + 0.2 / 4 = 0.85 expected


@needs_photos
def test_real_photos_are_used_and_deterministic(tmp_path: Path) -> None:
    spec = SampleSpec(num_images=8, num_classes=4, size=(48, 64))
    make_image_folder(tmp_path / "a", spec, photos=SHARED_PHOTOS)
    make_image_folder(tmp_path / "b", spec, photos=SHARED_PHOTOS)
    make_image_folder(tmp_path / "synthetic", spec, photos=False)
    a, b = read_tree(tmp_path / "a"), read_tree(tmp_path / "b")
    assert a == b
    synthetic = read_tree(tmp_path / "synthetic")
    assert all(a[name] != synthetic[name] for name in a)


# --- natural-looking: compresses like a photograph ----------------------------------------


def test_synthetic_photo_compresses_like_a_photo() -> None:
    # A 500x375 photograph at JPEG q90 takes tens of KB; a smooth gradient ~2 KB and white
    # noise ~200 KB. The band below separates the three.
    sizes = []
    for seed in range(4):
        pixels = sample.synthesize_photo(np.random.default_rng(seed), (375, 500))
        assert pixels.shape == (375, 500, 3)
        assert pixels.dtype == np.uint8
        assert pixels.std() > 10  # not flat
        sizes.append(jpeg_kb(pixels))
    assert all(15 <= kb <= 100 for kb in sizes), sizes

    gradient = np.broadcast_to(
        np.linspace(0, 255, 500, dtype=np.uint8)[None, :, None], (375, 500, 3)
    )
    noise = np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8)
    assert jpeg_kb(np.ascontiguousarray(gradient)) < 15
    assert jpeg_kb(noise) > 100


def test_synthetic_photo_is_deterministic() -> None:
    first = sample.synthesize_photo(np.random.default_rng(7), (30, 40))
    second = sample.synthesize_photo(np.random.default_rng(7), (30, 40))
    np.testing.assert_array_equal(first, second)


def test_fallback_folder_compresses_like_photos(tmp_path: Path) -> None:
    spec = SampleSpec(num_images=6, num_classes=3, size=(375, 500))
    paths = make_image_folder(tmp_path, spec, photos=False)
    mean_kb = np.mean([p.stat().st_size for p in paths]) / 1024
    assert 15 <= mean_kb <= 100


@needs_photos
def test_photo_folder_compresses_like_photos(tmp_path: Path) -> None:
    spec = SampleSpec(num_images=6, num_classes=3, size=(375, 500))
    paths = make_image_folder(tmp_path, spec, photos=SHARED_PHOTOS)
    mean_kb = np.mean([p.stat().st_size for p in paths]) / 1024
    assert 10 <= mean_kb <= 100


# --- target and options -------------------------------------------------------------------


def test_non_empty_target_needs_overwrite(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(TargetExistsError, match=str(tmp_path)):
        make_image_folder(tmp_path, TINY, photos=False)
    make_image_folder(tmp_path, TINY, photos=False, overwrite=True)
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert len(list(tmp_path.rglob("*.jpg"))) == TINY.num_images


def test_target_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(TargetExistsError, match="not a folder"):
        make_image_folder(tmp_path / "file", TINY, photos=False, overwrite=True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_images", 0),
        ("num_classes", 0),
        ("size", (0, 10)),
        ("size", (10,)),
        ("size_jitter", -0.1),
        ("size_jitter", 1.0),
        ("fmt", "gif"),
        ("quality", 0),
        ("quality", 101),
        ("seed", -1),
    ],
)
def test_bad_spec_is_rejected(field: str, value: object) -> None:
    with pytest.raises(OptionsError, match=field):
        SampleSpec(**{field: value})  # type: ignore[arg-type]


def test_negative_workers_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match="workers"):
        make_image_folder(tmp_path, TINY, photos=False, workers=-1)


# --- scripts/make_images.py ---------------------------------------------------------------


def load_script() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "scripts" / "make_images.py"
    spec = importlib.util.spec_from_file_location("make_images", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_makes_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script()
    out = tmp_path / "images"
    argv = [str(out), "--num", "6", "--classes", "2", "--size", "20", "30", "--synthetic"]
    script.main(argv)
    printed = capsys.readouterr().out
    assert "made 6 jpeg images" in printed
    assert "synthetic" in printed
    assert "MB" in printed
    assert sorted(p.name for p in out.iterdir()) == ["class_00", "class_01"]
    with Image.open(next(out.rglob("*.jpg"))) as image:
        assert image.size == (30, 20)


def test_script_flat_png_with_jitter(tmp_path: Path) -> None:
    script = load_script()
    out = tmp_path / "images"
    argv = f"{out} --num 5 --size 20 30 --jitter 0.2 --format png --flat --synthetic --seed 3"
    script.main(argv.split())
    assert sorted(p.name for p in out.iterdir()) == [f"img_{i:06d}.png" for i in range(5)]
