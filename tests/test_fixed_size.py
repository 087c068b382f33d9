"""The training image pipeline through make_loader: mixed sizes to fixed-size batches."""

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from h5pack import OptionsError, make_loader
from h5pack.core import format as fmt
from h5pack.core.decode import decode_image
from h5pack.read.crop import (
    CropSpec,
    crop_array,
    crop_into,
    opencv_resize_into,
    pillow_resize_into,
    plan_crop,
    scale_box,
)
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.synthetic import synthesize_photo
from h5pack.training import resize
from h5pack.training.cache import CacheSpec, DecodedCache
from h5pack.training.fixed_size import FixedSizeReader
from h5pack.training.resize import resize_kernel, torch_resize_into
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions
from tests.helpers import crops_one_by_one

SIZES = [(40, 60), (64, 48), (50, 50), (33, 90), (80, 36), (45, 70)]
NUM = 24


def photo(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A smooth image with structure (so that crops and flips are visible in the pixels)."""
    y, x = np.mgrid[0:height, 0:width]
    base = rng.integers(0, 256, 3)
    image = (base + 3 * x[..., None] + 2 * y[..., None] * np.array([1, -1, 2])) % 256
    return image.astype(np.uint8)


def jpeg(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [photo(rng, *SIZES[i % len(SIZES)]) for i in range(NUM)]


@pytest.fixture(scope="module")
def packs(tmp_path_factory, images) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packs")
    labels = [i % 3 for i in range(NUM)]
    options = ConvertOptions(chunk_bytes=8192, seed=1)
    encoded = root / "encoded.h5"
    write_arrays(encoded, [jpeg(a) for a in images], labels, options=options)
    variable = root / "variable.h5"
    write_arrays(variable, images, labels, options=ConvertOptions(mode="raw", chunk_bytes=8192))
    fixed = root / "fixed.h5"
    same = [a[:32, :32] for a in images]
    write_arrays(fixed, same, labels, options=ConvertOptions(chunk_samples=5))
    return {"encoded": encoded, "variable": variable, "fixed": fixed}


def epoch_of(loader, epoch: int) -> tuple[torch.Tensor, list[int]]:
    loader.set_epoch(epoch)
    images, labels = [], []
    for batch_images, batch_labels in loader:
        images.append(batch_images)
        labels.extend(batch_labels.tolist())
    return torch.cat(images), labels


def test_mixed_sizes_without_size_are_refused_when_the_loader_is_built(packs):
    for kind in ("encoded", "variable"):
        with pytest.raises(OptionsError, match=r"size=.*--size"):
            make_loader(packs[kind], 4, num_workers=0)
    make_loader(packs["fixed"], 4, num_workers=0)  # one size: batches stack


@pytest.mark.parametrize("kind", ["encoded", "variable", "fixed"])
def test_every_kind_of_pack_gives_fixed_size_batches_of_every_sample_once(packs, kind):
    loader = make_loader(packs[kind], 5, size=(24, 20), flip=True, num_workers=0, seed=3)
    images, labels = epoch_of(loader, 0)
    assert images.shape == (NUM, 3, 24, 20)
    assert images.dtype == torch.uint8
    order = np.concatenate(loader.chunk_sampler.plan(0))
    assert sorted(order.tolist()) == list(range(NUM))
    assert labels == fmt.load_meta(packs[kind]).labels[order].tolist()


def _expected(pack: Path, images: list, spec: CropSpec, seed: int, epoch: int, index: int):
    meta = fmt.load_meta(pack)
    height, width = meta.shapes[index][:2].tolist()
    source = images[int(meta.source_index[index])][:height, :width]  # "fixed" keeps 32x32
    box, flip = plan_crop(spec, *source.shape[:2], seed=seed, epoch=epoch, index=index)
    return crop_array(source, box, spec.size, flip=flip, backend=spec.backend)


@pytest.mark.parametrize("backend", ["pillow", "opencv"])
@pytest.mark.parametrize(
    ("kind", "threads"), [("variable", 1), ("variable", 2), ("fixed", 1), ("fixed", 2)]
)
def test_raw_pixels_are_the_planned_crop_of_the_source(packs, images, backend, kind, threads):
    """Blob and array raw packs, one thread or two: the per-batch loop is plan_crop's cut."""
    spec = CropSpec.of((24, 20), crop="random-resized", flip=True, backend=backend)
    loader = make_loader(
        packs[kind],
        6,
        size=(24, 20),
        flip=True,
        num_workers=0,
        seed=5,
        reader=ReaderOptions(threads=threads, backend=backend),
    )
    assert fmt.load_meta(packs[kind]).storage == ("array" if kind == "fixed" else "blob")
    got, _ = epoch_of(loader, 2)
    order = np.concatenate(loader.chunk_sampler.plan(2))
    for position, index in enumerate(order.tolist()):
        want = _expected(packs[kind], images, spec, 5, 2, index)
        diff = np.abs(got[position].permute(1, 2, 0).numpy().astype(int) - want)
        # Pillow's filter computed by torch: within one grey level of Pillow itself
        assert diff.max() <= (1 if backend == "pillow" else 0), index


def test_encoded_pixels_match_a_full_decode_of_the_same_box(packs, images):
    spec = CropSpec.of(16, crop="center")
    loader = make_loader(packs["encoded"], 6, size=16, crop="center", num_workers=0, shuffle=False)
    got, _ = epoch_of(loader, 0)
    meta = fmt.load_meta(packs["encoded"])
    for index in range(NUM):
        data = jpeg(images[int(meta.source_index[index])])
        decoded = decode_image(data)
        box, flip = plan_crop(spec, *decoded.shape[:2], seed=0, epoch=0, index=index)
        want = crop_array(decoded, box, spec.size, flip=flip).astype(int)
        diff = np.abs(got[index].permute(1, 2, 0).numpy().astype(int) - want)
        assert diff.mean() < 3, index  # JPEG DCT scaling (read.crop) stays this close


@pytest.mark.parametrize("num_workers", [0, 2])
def test_crops_and_flips_are_a_function_of_seed_epoch_and_sample(packs, num_workers):
    def run(seed: int, epoch: int) -> torch.Tensor:
        loader = make_loader(
            packs["encoded"], 4, size=16, flip=True, num_workers=num_workers, seed=seed
        )
        images, _ = epoch_of(loader, epoch)
        return images

    first = run(7, 1)
    assert torch.equal(first, run(7, 1))
    assert not torch.equal(first, run(7, 2))
    assert not torch.equal(first, run(8, 1))


def test_a_resumed_epoch_continues_with_the_same_images(packs):
    loader = make_loader(packs["variable"], 4, size=16, flip=True, num_workers=2, seed=1)
    whole, _ = epoch_of(loader, 3)
    loader.set_epoch(3)
    seen = []
    for position, (images, _) in enumerate(loader):
        seen.append(images)
        if position == 1:
            state = loader.state_dict()
            break
    resumed = make_loader(packs["variable"], 4, size=16, flip=True, num_workers=2, seed=1)
    resumed.load_state_dict(state)  # the epoch comes from the state, not from set_epoch
    seen.extend(images for images, _ in resumed)
    assert torch.equal(torch.cat(seen), whole)


def test_decoded_cache_serves_later_epochs_without_decoding(packs):
    with make_loader(
        packs["encoded"], 4, size=16, num_workers=2, cache=CacheSpec(cache_bytes=4 << 20)
    ) as loader:
        first, _ = epoch_of(loader, 0)
        stats = loader.cache.stats()
        assert (stats.misses, stats.entries, stats.hits) == (NUM, NUM, 0)
        epoch_of(loader, 1)
        after = loader.cache.stats()
        assert (after.misses, after.hits) == (NUM, NUM)  # nothing decoded again
        assert torch.equal(epoch_of(loader, 0)[0], first)  # the same crops, from the cache


def test_cache_within_a_tiny_budget_still_serves_every_sample(packs):
    budget = 64 * 1024  # the index and a few images
    with make_loader(
        packs["encoded"], 4, size=16, num_workers=0, cache=CacheSpec(cache_bytes=budget)
    ) as loader:
        first, labels = epoch_of(loader, 0)
        second, _ = epoch_of(loader, 0)
        stats = loader.cache.stats()
        assert stats.used_bytes <= budget
        assert 0 < stats.entries < NUM
        assert torch.equal(first, second)
        assert len(labels) == NUM


def test_cache_options_that_cannot_apply_are_refused(packs):
    with pytest.raises(OptionsError, match="applies to encoded packs"):
        make_loader(packs["fixed"], 4, size=16, cache="decoded")
    with pytest.raises(OptionsError, match="needs size="):
        make_loader(packs["encoded"], 4, cache="decoded")
    with pytest.raises(OptionsError, match="need size="):
        make_loader(packs["encoded"], 4, crop="center")
    with pytest.raises(OptionsError, match=r"cache_bytes= moved to cache=CacheSpec\("):
        make_loader(packs["encoded"], 4, size=16, cache_bytes=1 << 20)


def test_collate_list_keeps_original_sizes(packs, images):
    loader = make_loader(packs["encoded"], 5, collate="list", num_workers=0, shuffle=False)
    batch, labels = next(iter(loader))
    meta = fmt.load_meta(packs["encoded"])
    assert isinstance(batch, list)
    assert len(batch) == len(labels) == 5
    for index, image in enumerate(batch):
        height, width = images[int(meta.source_index[index])].shape[:2]
        assert tuple(image.shape) == (3, height, width)


def test_scale_box_maps_a_box_onto_a_shrunk_image():
    spec = CropSpec.of(8, crop="random-resized")
    box, _ = plan_crop(spec, 400, 300, seed=0, epoch=0, index=3)
    small = scale_box(box, (400, 300), (200, 150))
    assert abs(small.top - box.top / 2) <= 1
    assert abs(small.height - box.height / 2) <= 1
    assert small.top + small.height <= 200
    assert small.left + small.width <= 150


@pytest.mark.parametrize(
    ("source", "out"),
    [((375, 500), (224, 224)), ((150, 180), (224, 224)), ((300, 90), (64, 200)), ((9, 7), (3, 2))],
)
def test_torch_kernel_is_pillows_filter_within_one_level(source, out):
    pixels = synthesize_photo(np.random.default_rng(0), (source[0] + 20, source[1] + 30))
    view = pixels[10 : 10 + source[0], 20 : 20 + source[1]]  # row-strided, like a box
    view.flags.writeable = False  # like a cached image
    batch = np.zeros((2, *out, 3), dtype=np.uint8)
    address = batch.ctypes.data
    torch_resize_into(view, batch[1])
    want = np.empty((*out, 3), dtype=np.uint8)
    pillow_resize_into(view, want)
    diff = np.abs(batch[1].astype(int) - want)
    assert diff.max() <= 1
    assert diff.mean() < 0.25  # 0.00-0.01 shrinking or enlarging both sides, 0.16 mixed
    assert batch.ctypes.data == address
    assert not batch[0].any()


def test_enlarging_boxes_are_pillows_filter_within_one_level(monkeypatch):
    """Enlarging goes to OpenCV's bilinear resize (NOTE [ Pillow's filter, computed by
    torch ]): within one level of Pillow, and of torch's kernel, at every size."""
    rng = np.random.default_rng(8)
    for trial in range(300):
        out_h, out_w = int(rng.integers(1, 120)), int(rng.integers(1, 120))
        height, width = int(rng.integers(1, out_h + 1)), int(rng.integers(1, out_w + 1))
        if trial % 2:
            source = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)  # noise
        else:
            source = synthesize_photo(rng, (height, width))
        pillow = np.empty((out_h, out_w, 3), dtype=np.uint8)
        pillow_resize_into(source, pillow)
        monkeypatch.setattr(resize, "ENLARGE_WITH_OPENCV", True)
        opencv = np.empty_like(pillow)
        torch_resize_into(source, opencv)
        monkeypatch.setattr(resize, "ENLARGE_WITH_OPENCV", False)
        by_torch = np.empty_like(pillow)
        torch_resize_into(source, by_torch)
        assert np.abs(opencv.astype(int) - pillow).max() <= 1, (source.shape, pillow.shape)
        assert np.abs(opencv.astype(int) - by_torch).max() <= 1, (source.shape, pillow.shape)


@pytest.mark.parametrize("kind", ["variable", "fixed"])
def test_the_per_batch_loop_enlarges_as_the_kernel_does(packs, kind, monkeypatch):
    """With or without OpenCV enlarging, the per-batch loop and the per-sample kernel agree
    exactly, boxes enlarged and shrunk."""
    spec = CropSpec.of(28, crop="random-resized", flip=True)
    reader = PackReader(packs[kind], ReaderOptions(threads=2))
    count = len(reader.meta.labels)
    images = reader.read_stored(np.arange(count))
    enlarged = shrunk = 0
    for switch in (True, False):
        monkeypatch.setattr(resize, "ENLARGE_WITH_OPENCV", switch)
        for epoch in range(3):
            out = np.zeros((count, 28, 28, 3), dtype=np.uint8)
            fixed = FixedSizeReader(reader, spec, None)
            fixed.read_into(np.arange(count), out, seed=1, epoch=epoch)
            for index in range(count):
                image = reader.decode(index, images[index])
                box, flip = plan_crop(spec, *image.shape[:2], seed=1, epoch=epoch, index=index)
                enlarged += box.height <= 28 and box.width <= 28
                shrunk += box.height > 28 and box.width > 28
                want = np.empty((28, 28, 3), dtype=np.uint8)
                crop_into(image, box, want, flip=flip, resize=torch_resize_into)
                np.testing.assert_array_equal(out[index], want, f"{switch}, {epoch}, {index}")
    assert enlarged > 0
    assert shrunk > 0


def test_without_torch_s_in_place_op_the_public_call_gives_the_same_pixels(monkeypatch):
    """NOTE [ Pillow's filter, computed by torch ]: the fallback, and its report."""
    from h5pack.bench.system import machine_info

    pixels = synthesize_photo(np.random.default_rng(2), (300, 260))
    box = pixels[20:270, 10:250]
    fast, public = np.empty((224, 224, 3), np.uint8), np.empty((224, 224, 3), np.uint8)
    torch_resize_into(box, fast)
    assert resize.resize_route() == "torch, in-place ATen op"
    monkeypatch.setattr(resize, "_AA_OUT", resize._interpolate_into)
    torch_resize_into(box, public)
    np.testing.assert_array_equal(public, fast)
    assert "public interpolate" in resize.resize_route()
    assert "public interpolate" in machine_info().describe()


def test_torch_kernel_hands_one_channel_to_pillow():
    pixels = np.random.default_rng(1).integers(0, 256, (40, 50, 1), dtype=np.uint8)
    got, want = np.empty((16, 20, 1), np.uint8), np.empty((16, 20, 1), np.uint8)
    torch_resize_into(pixels, got)
    pillow_resize_into(pixels, want)
    np.testing.assert_array_equal(got, want)


def test_resize_kernel_of_each_backend():
    assert resize_kernel("pillow") is torch_resize_into
    assert resize_kernel("opencv") is opencv_resize_into


def test_cache_hits_read_nothing_from_the_pack(packs, monkeypatch):
    spec = CropSpec.of(16, crop="random-resized", flip=True)
    reader = PackReader(packs["encoded"], ReaderOptions())
    with DecodedCache(NUM, 4 << 20) as cache:
        fixed = FixedSizeReader(reader, spec, cache)
        read = []
        original = reader.read_stored

        def counting(indices):
            read.extend(np.asarray(indices).tolist())
            return original(indices)

        monkeypatch.setattr(reader, "read_stored", counting)
        out = np.empty((NUM, 16, 16, 3), dtype=np.uint8)
        everything = np.arange(NUM)
        fixed.read_into(everything, out, seed=0, epoch=0)
        assert sorted(read) == list(range(NUM))
        first = out.copy()
        fixed.read_into(everything, out, seed=0, epoch=0)
        assert sorted(read) == list(range(NUM))  # nothing read again
        np.testing.assert_array_equal(out, first)
        assert fixed.decodes == NUM


def test_a_full_cache_sends_the_rest_down_the_uncached_path(packs):
    spec = CropSpec.of(16, crop="center")
    reader = PackReader(packs["encoded"], ReaderOptions())
    budget = 3 * 4096  # the header, the index and a couple of images
    with DecodedCache(NUM, budget) as cache:
        fixed = FixedSizeReader(reader, spec, cache)
        out = np.empty((NUM, 16, 16, 3), dtype=np.uint8)
        fixed.read_into(np.arange(NUM), out, seed=0, epoch=0)
        stats = cache.stats()
        assert 0 < stats.entries < NUM
        assert stats.rejected == 0  # never offered what could not fit
        uncached = FixedSizeReader(reader, spec, None)
        want = np.empty_like(out)
        uncached.read_into(np.arange(NUM), want, seed=0, epoch=0)
        np.testing.assert_array_equal(out, want)  # the same pixels (issue 20 D)


# -- issue 20 D: the decoded cache never changes a pixel ------------------------------------
# Large JPEGs (some boxes allow a reduced decode), EXIF orientations, a gray and a CMYK JPEG
# and a PNG: every kind of decode path the pipeline has.


def _mixed_files() -> list[bytes]:
    rng = np.random.default_rng(7)
    files = []
    for i in range(12):
        pixels = synthesize_photo(rng, (300 + 37 * i, 420 - 11 * i))
        image = Image.fromarray(pixels)
        exif = Image.Exif()
        if i % 4 == 1:
            exif[0x0112] = 6  # transposing
        elif i % 4 == 2:
            exif[0x0112] = 3
        if i == 9:
            image = image.convert("L")
        if i == 10:
            image = image.convert("CMYK")
        buffer = io.BytesIO()
        if i == 11:
            image.save(buffer, format="PNG")
        else:
            image.save(buffer, format="JPEG", quality=90, exif=exif.tobytes())
        files.append(buffer.getvalue())
    return files


@pytest.fixture(scope="module")
def mixed_pack(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mixed") / "mixed.h5"
    files = _mixed_files()
    write_arrays(path, files, [0] * len(files), options=ConvertOptions(chunk_bytes=1 << 16))
    return path


def _epoch(reader, spec, cache, epoch, indices=None):
    fixed = FixedSizeReader(reader, spec, cache)
    count = len(reader.meta.labels)
    indices = np.arange(count) if indices is None else np.asarray(indices)
    out = np.zeros((len(indices), *spec.size, 3), dtype=np.uint8)
    fixed.read_into(indices, out, seed=3, epoch=epoch)
    return out


@pytest.mark.parametrize("crop", ["random-resized", "center"])
def test_an_epoch_is_the_same_with_and_without_the_cache(mixed_pack, crop):
    spec = CropSpec.of(48, crop=crop, flip=True)
    reader = PackReader(mixed_pack, ReaderOptions())
    count = len(reader.meta.labels)
    reductions = 0
    for epoch in range(4):
        for index in range(count):  # the data must exercise the reduced decode
            height, width = reader.meta.shapes[index][:2].tolist()
            box, _ = plan_crop(spec, height, width, seed=3, epoch=epoch, index=index)
            reductions += min(box.height, box.width) >= 48 * 2 * 2
    assert reductions > 0
    with DecodedCache(count, 64 << 20) as full:
        for epoch in range(4):  # epoch 0 fills the cache, the others are served from it
            want = _epoch(reader, spec, None, epoch)
            np.testing.assert_array_equal(_epoch(reader, spec, full, epoch), want, f"{epoch}")
        assert full.stats().entries > 0


def test_what_a_partial_cache_holds_changes_no_pixel(mixed_pack):
    spec = CropSpec.of(48, crop="random-resized", flip=True)
    reader = PackReader(mixed_pack, ReaderOptions())
    count = len(reader.meta.labels)
    wants = [_epoch(reader, spec, None, epoch) for epoch in range(3)]
    for held in ([0, 1, 2, 3], [8, 9, 10, 11], list(range(1, count, 2))):
        with DecodedCache(count, 64 << 20) as partial:
            _epoch(reader, spec, partial, 0, indices=held)  # another process filled these
            for epoch in range(3):
                got = _epoch(reader, spec, partial, epoch)
                np.testing.assert_array_equal(got, wants[epoch], f"{held} {epoch}")


def test_a_shrinking_cache_gives_the_same_pixels_whatever_it_holds(mixed_pack):
    spec = CropSpec.of(48, crop="random-resized", flip=True)
    reader = PackReader(mixed_pack, ReaderOptions())
    count = len(reader.meta.labels)
    with DecodedCache(count, 64 << 20, max_side=120) as roomy:
        wants = [_epoch(reader, spec, roomy, epoch) for epoch in range(2)]
    with DecodedCache(count, 3 * 4096 + 120 * 200 * 3, max_side=120) as tight:
        for epoch in range(2):
            got = _epoch(reader, spec, tight, epoch)
            assert 0 < tight.stats().entries < count
            np.testing.assert_array_equal(got, wants[epoch], f"{epoch}")


def test_two_runs_with_a_partial_cache_serve_the_same_epochs(mixed_pack):
    runs = []
    for _ in range(2):
        with make_loader(
            mixed_pack, 3, size=48, flip=True, num_workers=2, cache=CacheSpec(cache_bytes=1 << 19)
        ) as loader:
            runs.append([epoch_of(loader, epoch)[0] for epoch in range(2)])
            assert 0 < loader.cache.stats().entries < 12
    plain = make_loader(mixed_pack, 3, size=48, flip=True, num_workers=2)  # the same order
    for epoch in range(2):
        assert torch.equal(runs[0][epoch], runs[1][epoch])
        assert torch.equal(runs[0][epoch], epoch_of(plain, epoch)[0])


def test_pipeline_and_cache_objects_whole_serve_what_the_keywords_serve(packs):
    from h5pack.read.crop import CropSpec
    from h5pack.training.cache import CacheSpec

    with (
        make_loader(
            packs["encoded"], 4, size=16, flip=True, cache=CacheSpec(cache_bytes=4 << 20), seed=2
        ) as by_keywords,
        make_loader(
            packs["encoded"],
            4,
            pipeline=CropSpec(size=(16, 16), crop="random-resized", flip=True),
            cache=CacheSpec(cache_bytes=4 << 20),
            seed=2,
        ) as whole,
    ):
        assert whole.dataset.crop == by_keywords.dataset.crop
        assert whole.cache is not None
        assert whole.cache.budget_bytes == 4 << 20
        assert torch.equal(epoch_of(whole, 1)[0], epoch_of(by_keywords, 1)[0])
    # a keyword replaces the field of its name in the pipeline given
    center = make_loader(
        packs["variable"], 4, pipeline=CropSpec(size=(16, 16), crop="resize"), crop="center"
    )
    assert center.dataset.crop.crop == "center"
    assert center.dataset.crop.size == (16, 16)


@pytest.mark.parametrize("crop", ["random-resized", "center", "resize"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("phase", [None, (1, 1 << 30), (3, 1 << 30), (8, 1)])
def test_the_per_batch_loop_gives_decode_crop_into_s_pixels(
    mixed_pack, crop, threads, phase, monkeypatch
):
    """Every kind of file, one thread or two, JPEGs decoded in groups or one by one (None:
    the default groups; (8, 1): the bytes bound ends each group after one image): each
    sample is what the per-sample path cuts."""
    if phase is not None:
        monkeypatch.setattr(FixedSizeReader, "decode_phase", phase[0])
        monkeypatch.setattr(FixedSizeReader, "decode_phase_bytes", phase[1])
    spec = CropSpec.of(48, crop=crop, flip=True)
    reader = PackReader(mixed_pack, ReaderOptions(threads=threads))
    count = len(reader.meta.labels)
    kernel = resize_kernel(spec.backend)
    stored = reader.read_stored(np.arange(count))
    with DecodedCache(count, 64 << 20) as cache:
        for epoch in range(3):  # epoch 0 fills the cache; 1, 2 cut its hits together
            want = np.empty((count, 48, 48, 3), dtype=np.uint8)
            crops_one_by_one(stored, spec, want, seed=3, epoch=epoch, resize=kernel)
            fixed = FixedSizeReader(reader, spec, None)
            out = np.zeros_like(want)
            fixed.read_into(np.arange(count), out, seed=3, epoch=epoch)
            np.testing.assert_array_equal(out, want, f"uncached, epoch {epoch}")
            assert fixed.decodes == count
            np.testing.assert_array_equal(_epoch(reader, spec, cache, epoch), want, f"{epoch}")
