"""Damaged packs: a clean FormatError or correct data, never wrong data, a hang or a traceback.

Issue 9: zeroed blocks of metadata (the corpus), zeroed labels and paths, single-bit flips
in chunks of codecs without a checksum of their own, and the probe that keeps `info` and
`verify` from hanging on 1.0 packs whose global heap is damaged.
"""

import collections
import shutil
import zlib

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from torch.utils.data import DataLoader

import h5pack.check
from h5pack.check import pack_info, verify_pack
from h5pack.cli.main import cli
from h5pack.core import format as fmt
from h5pack.core import integrity
from h5pack.core.layout import Compression
from h5pack.errors import FormatError
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.training.dataset import H5ImageDataset
from h5pack.write.convert import write_arrays
from h5pack.write.options import ConvertOptions
from tests.compat_pack import V1_ARRAY, V1_BLOB
from tests.damage_cases import metadata_offsets, run_corpus


def _pack(path, *, num=301, shape=(16, 16, 3), mode="raw", **options):
    rng = np.random.default_rng(0)
    samples = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(num)]
    if mode == "encoded":
        from tests.helpers import png

        samples = [png(s) for s in samples]
    write_arrays(
        path,
        samples,
        [i % 7 for i in range(num)],
        classes=[f"class_{k}" for k in range(7)],
        paths=[f"class_{i % 7}/img_{i:05d}.png" for i in range(num)],
        options=ConvertOptions(mode=mode, **options),
    )
    return path


# -- the corpus: zeroed 4 KiB blocks spread over the metadata ----------------------------

LAYOUTS = {
    "zstd": {"chunk_samples": 32, "compression": Compression(codec="zstd")},
    "none": {"chunk_samples": 32},
    "contiguous": {"layout": "contiguous"},
    "encoded-lz4": {
        "mode": "encoded",
        "chunk_bytes": 8192,
        "compression": Compression(codec="lz4"),
    },
}


def _assert_clean(results):
    bad = [
        r
        for r in results
        if "outcome" in r
        or r["read"] == "wrong"
        or any(str(r[k]).startswith(("other", "format-unnamed")) for k in ("info", "verify"))
        or str(r["read"]).startswith(("other", "format-unnamed"))
        or (r["verify"] == "ok" and r["read"] not in ("correct", "format"))
    ]
    assert bad == [], bad
    return collections.Counter(f"{r['info']}/{r['verify']}/{r['read']}" for r in results)


@pytest.mark.parametrize("layout", ["zstd", "encoded-lz4"])
def test_zeroed_metadata_gives_a_clean_error_or_correct_data(tmp_path, layout):
    pack = _pack(tmp_path / "p.h5", **LAYOUTS[layout])
    results = run_corpus(pack, metadata_offsets(pack, 40), tmp_path, limit_cpu_s=10)
    assert len(results) == len(metadata_offsets(pack, 40))
    outcomes = _assert_clean(results)
    assert outcomes["format/format/format"] > 0  # the corpus does hit the metadata


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_corpus_of_200_zeroed_blocks(tmp_path, layout):
    pack = _pack(tmp_path / "p.h5", num=1001, **LAYOUTS[layout])
    offsets = metadata_offsets(pack, 200)
    _assert_clean(run_corpus(pack, offsets, tmp_path, limit_cpu_s=10))


def _heap_damaged_v1(tmp_path):
    """A frozen 1.0 pack whose global heap (its text attributes) makes HDF5 loop forever."""
    damaged = tmp_path / "v1_damaged.h5"
    shutil.copyfile(V1_ARRAY, damaged)
    data = damaged.read_bytes()
    heap = data.find(b"GCOL")
    assert heap > 0
    with open(damaged, "r+b") as raw:
        raw.seek(heap + 138)  # inside the heap's objects: HDF5 loops (found by the corpus)
        raw.write(b"\0" * 4096)
    return damaged


def test_info_and_verify_report_a_pack_that_makes_hdf5_loop(tmp_path):
    damaged = _heap_damaged_v1(tmp_path)
    with pytest.raises(FormatError, match=r"did not finish within 3 s.*damaged"):
        pack_info(damaged, timeout_s=3)
    with pytest.raises(FormatError, match=r"did not finish within 3 s.*damaged"):
        verify_pack(damaged, timeout_s=3)


def test_cli_info_and_verify_never_hang(tmp_path, monkeypatch):
    damaged = _heap_damaged_v1(tmp_path)
    monkeypatch.setattr(h5pack.check, "PROBE_TIMEOUT_S", 3.0)
    for command in (["info", str(damaged)], ["verify", "-q", str(damaged)]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 1, result.output
        assert "did not finish within 3 s" in result.output
        assert "Traceback" not in result.output


def test_probe_passes_good_packs_and_names_damage(tmp_path):
    pack = _pack(tmp_path / "p.h5", num=20, chunk_samples=8)
    assert pack_info(pack, timeout_s=600).num_samples == 20
    assert verify_pack(pack, timeout_s=600).ok
    with h5py.File(pack, "r") as handle:
        start = handle[fmt.LABELS].id.get_offset()
    with open(pack, "r+b") as raw:
        raw.seek(start)
        raw.write(b"\0" * 64)
    with pytest.raises(FormatError, match=r"'labels' no longer match"):
        pack_info(pack, timeout_s=600)
    with pytest.raises(FileNotFoundError):
        pack_info(tmp_path / "missing.h5", timeout_s=600)


# -- damaged labels and paths --------------------------------------------------------------


def _zero(path, start, count=4096):
    with open(path, "r+b") as raw:
        raw.seek(start)
        raw.write(b"\0" * count)


def test_zeroed_labels_are_reported_and_refused(tmp_path):
    pack = _pack(tmp_path / "p.h5", num=1001, shape=(4, 4, 3), chunk_samples=64)
    with h5py.File(pack, "r") as handle:
        labels = handle[fmt.LABELS]
        assert labels.chunks is None  # contiguous: its bytes lie at get_offset()
        start = labels.id.get_offset()
    _zero(pack, start + 1024)
    result = CliRunner().invoke(cli, ["verify", "-q", str(pack)])
    assert result.exit_code == 1
    assert "metadata 'labels' does not match the CRC32" in result.output
    report = verify_pack(pack)
    assert next(p.message for p in report.problems if p.index is None).startswith(
        "metadata 'labels'"
    )
    assert report.num_verified == 1001  # the samples themselves are intact
    from h5pack.training.loader import make_loader

    with pytest.raises(FormatError, match=r"p\.h5: the pack's metadata is damaged: 'labels'"):
        make_loader(pack, 16, num_workers=0)
    with pytest.raises(FormatError, match="'labels'"):
        PackReader(pack)


def test_zeroed_paths_are_reported(tmp_path):
    pack = _pack(tmp_path / "p.h5", num=1001, shape=(4, 4, 3), chunk_samples=64)
    with h5py.File(pack, "r") as handle:
        start = handle[fmt.PATHS].id.get_chunk_info(0).byte_offset
    _zero(pack, start, 1024)
    report = verify_pack(pack)
    assert not report.ok
    assert any("'paths'" in p.message for p in report.problems)
    result = CliRunner().invoke(cli, ["verify", "-q", str(pack)])
    assert result.exit_code == 1
    assert "'paths'" in result.output
    with PackReader(pack) as reader, pytest.raises(FormatError, match="'paths'"):
        reader.paths  # noqa: B018
    dataset = H5ImageDataset(pack, return_path=True)
    with pytest.raises(FormatError, match="'paths'"):
        dataset[0]


def test_paths_changed_without_a_read_error_are_caught_by_their_digest(tmp_path):
    pack = _pack(tmp_path / "p.h5", num=40, chunk_samples=8)
    with h5py.File(pack, "r+") as handle:  # damage that still decompresses
        paths = handle[fmt.PATHS]
        _, stored = paths.id.read_direct_chunk((0,))
        raw = bytearray(zlib.decompress(stored))
        raw[3] ^= 0x01
        paths.id.write_direct_chunk((0,), zlib.compress(bytes(raw)))
    with PackReader(pack) as reader, pytest.raises(FormatError, match="'paths' no longer match"):
        reader.paths  # noqa: B018
    report = verify_pack(pack)
    assert [str(p) for p in report.problems] == [
        "pack: metadata 'paths' does not match the CRC32 recorded at conversion: it is damaged"
    ]


# -- pixels: single-bit flips with default settings ----------------------------------------


def _flip_bit(path, chunk=1, where=0.5):
    with h5py.File(path, "r") as handle:
        images = handle[fmt.IMAGES]
        if images.chunks is None:
            offset = images.id.get_offset() + int(images.id.get_storage_size() * where)
        else:
            info = images.id.get_chunk_info(chunk)
            offset = info.byte_offset + int(info.size * where)
    with open(path, "r+b") as raw:
        raw.seek(offset)
        byte = raw.read(1)[0]
        raw.seek(offset)
        raw.write(bytes([byte ^ 0x10]))


FLIPS = {
    "zstd": {"chunk_samples": 32, "compression": Compression(codec="zstd")},
    "lz4": {"chunk_samples": 32, "compression": Compression(codec="lz4")},
    "none": {"chunk_samples": 32},
    "contiguous": {"layout": "contiguous"},
    "encoded-zstd": {
        "mode": "encoded",
        "chunk_bytes": 16384,
        "compression": Compression(codec="zstd"),
    },
}


@pytest.mark.parametrize("layout", sorted(FLIPS))
@pytest.mark.parametrize("where", [0.3, 0.7])
def test_a_flipped_bit_is_never_served_by_default(tmp_path, layout, where):
    pack = _pack(tmp_path / "p.h5", num=200, **FLIPS[layout])
    _flip_bit(pack, where=where)
    named = r"p\.h5: .*(sample \d+ \(class_\d/img_\d+\.png\)|chunk group \d+)"
    with PackReader(pack) as reader, pytest.raises(FormatError, match=named):
        reader.read_stored(np.arange(len(reader)))
    dataset = H5ImageDataset(pack, output="hwc")
    loader = DataLoader(dataset, batch_size=50, num_workers=0, collate_fn=list)
    with pytest.raises(FormatError, match=named):
        for _ in loader:
            pass
    assert not verify_pack(pack).ok


def test_checks_can_be_turned_off(tmp_path):
    pack = _pack(tmp_path / "p.h5", num=64, chunk_samples=32)
    _flip_bit(pack, chunk=0)
    with PackReader(pack, ReaderOptions(verify_checksums=False)) as reader:
        assert len(reader.read_stored(np.arange(64))) == 64  # served as stored


@pytest.mark.parametrize("pack", [V1_ARRAY, V1_BLOB], ids=["v1-gzip", "v1-zstd-blob"])
def test_a_v1_pack_is_checked_with_its_crc32(tmp_path, pack):
    copy = tmp_path / "v1.h5"
    shutil.copyfile(pack, copy)
    with PackReader(copy) as reader:  # intact: reads, checked with CRC32
        assert reader.checks.digest_name == "CRC32"
        reader.read_stored(np.arange(len(reader)))
    _flip_bit(copy, chunk=0)
    with PackReader(copy) as reader, pytest.raises(FormatError, match=r"v1\.h5"):
        reader.read_stored(np.arange(len(reader)))


def test_without_xxhash_readers_fall_back_on_crc32(tmp_path, monkeypatch):
    pack = _pack(tmp_path / "p.h5", num=64, chunk_samples=32, compression=Compression(codec="lz4"))
    monkeypatch.setattr(integrity, "has_sample_digest", lambda: False)
    with PackReader(pack) as reader:
        assert reader.checks.digest_name == "CRC32"
        reader.read_stored(np.arange(64))
    _flip_bit(pack, chunk=1)
    with PackReader(pack) as reader, pytest.raises(FormatError, match=r"CRC32|cannot be read"):
        reader.read_stored(np.arange(64))
