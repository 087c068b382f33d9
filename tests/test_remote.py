"""Remote packs (issue 17 items 3, 4, 6): opened from the compact index, one GET per chunk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from h5pack.core import format as fmt
from h5pack.core.index import FOOTER_BYTES, MAGIC, TAIL_BYTES
from h5pack.core.layout import Compression
from h5pack.core.source import SourceChangedError
from h5pack.errors import FormatError, PackNotFoundError, RemoteError
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.training.epochs import EpochSpec
from tests.helpers import arrays, jpeg, make_pack, random_arrays
from tests.s3local import Bucket, Fault

DATA = Path(__file__).parent / "data"

LAYOUTS = {
    "lz4-chunks": {"compression": Compression(codec="lz4"), "chunk_samples": 8},
    "zstd-chunks": {"compression": Compression(codec="zstd"), "chunk_samples": 5},
    "raw-chunks": {"chunk_samples": 8},
    "contiguous": {"layout": "contiguous"},
}


def reader(url: str, bucket: Bucket, **options: object) -> PackReader:
    return PackReader(url, ReaderOptions(storage_options=bucket.storage_options, **options))


def everything(pack: PackReader) -> tuple[list[bytes], list[int], list[str]]:
    stored = pack.read_stored(np.arange(len(pack)))
    return [s.tobytes() for s in stored], pack.meta.labels.tolist(), list(pack.paths)


def stored_chunk_bytes(path: Path) -> list[int]:
    with fmt.open_h5(path) as handle:
        images = handle[fmt.IMAGES]
        return [images.id.get_chunk_info(i).size for i in range(images.id.get_num_chunks())]


def test_published_packs_end_with_the_index(tmp_path: Path) -> None:
    path = make_pack(tmp_path / "a.h5")
    assert path.read_bytes()[-FOOTER_BYTES:][:8] == MAGIC


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_remote_pack_serves_what_the_local_one_does(
    layout: str, s3_bucket: Bucket, tmp_path: Path
) -> None:
    path = make_pack(tmp_path / "a.h5", **LAYOUTS[layout])  # type: ignore[arg-type]
    url = s3_bucket.put(path, "a.h5")
    counts = s3_bucket.proxy.counts
    with reader(url, s3_bucket, window_chunks=64) as remote, PackReader(path) as local:
        opened = counts.total
        # the pack is smaller than the tail: rclone refuses the suffix (416), S3 would not
        assert opened <= 2
        assert everything(remote) == everything(local)
        assert counts.total == opened + remote.chunk_map.num_chunks  # one GET per chunk
        assert remote.loads == remote.chunk_map.num_chunks


def test_a_chunk_is_one_get_of_its_stored_bytes(s3_bucket: Bucket, tmp_path: Path) -> None:
    samples = random_arrays(300, (16, 16, 3))
    path = make_pack(
        tmp_path / "a.h5", samples=samples, compression=Compression(codec="zstd"), chunk_samples=16
    )
    assert path.stat().st_size > TAIL_BYTES
    url = s3_bucket.put(path, "a.h5")
    with reader(url, s3_bucket, window_chunks=4) as remote:
        assert s3_bucket.proxy.counts.total == 1  # index and metadata in the tail
        before = s3_bucket.proxy.reset_counts()
        assert before.gets == 1
        order = np.random.default_rng(0).permutation(len(remote))
        for chunk in np.unique(remote.chunk_map.chunks_of(order)).tolist():
            remote.read_stored(list(remote.chunk_map.samples(chunk)))
        counts = s3_bucket.proxy.counts
        assert counts.gets == remote.chunk_map.num_chunks
        assert counts.body_bytes == sum(stored_chunk_bytes(path))


@pytest.mark.parametrize("num", [37, 6000])
def test_open_requests_do_not_grow_with_the_samples(
    num: int, s3_bucket: Bucket, tmp_path: Path
) -> None:
    path = make_pack(tmp_path / "a.h5", samples=arrays(num, (4, 4, 3)), chunk_samples=64)
    url = s3_bucket.put(path, "a.h5")
    with reader(url, s3_bucket) as remote:
        assert s3_bucket.proxy.counts.total <= 2
        assert remote.meta.num_samples == num
        assert remote.paths == PackReader(path).paths


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.h5")))
def test_frozen_packs_open_remotely(name: str, s3_bucket: Bucket) -> None:
    url = s3_bucket.put(DATA / name, name)
    with reader(url, s3_bucket, window_chunks=64) as remote, PackReader(DATA / name) as local:
        assert everything(remote) == everything(local)
        assert remote.meta.labels.tolist() == local.meta.labels.tolist()


def test_encoded_pack_decodes_remotely(s3_bucket: Bucket, tmp_path: Path) -> None:
    folder = tmp_path / "images"
    for i, image in enumerate(arrays(20, (12, 10, 3))):
        (folder / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (folder / f"c{i % 2}" / f"{i}.jpg").write_bytes(jpeg(image))
    from h5pack.write.convert import convert
    from h5pack.write.options import ConvertOptions

    convert(folder, tmp_path / "e.h5", ConvertOptions(mode="encoded"))
    url = s3_bucket.put(tmp_path / "e.h5", "e.h5")
    with reader(url, s3_bucket) as remote, PackReader(tmp_path / "e.h5") as local:
        assert everything(remote) == everything(local)
        got = remote.read_images(range(len(remote)))
        want = local.read_images(range(len(local)))
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_replaced_object_is_refused(s3_bucket: Bucket, tmp_path: Path) -> None:
    first = make_pack(tmp_path / "a.h5", chunk_samples=8)
    second = make_pack(tmp_path / "b.h5", samples=arrays(seed=1), chunk_samples=8)
    url = s3_bucket.put(first, "a.h5")
    with reader(url, s3_bucket) as remote:
        identity = remote.meta.identity
        s3_bucket.put(second, "a.h5")
        with pytest.raises(SourceChangedError, match=r"s3://.*a\.h5 was replaced"):
            remote.read_stored([0])
    with pytest.raises(FormatError, match="was replaced"):
        PackReader(url, ReaderOptions(storage_options=s3_bucket.storage_options), expected=identity)


@pytest.mark.parametrize(
    "fault",
    [Fault("reset"), Fault("status", status=503), Fault("truncate", keep_bytes=10)],
    ids=["reset", "503", "truncated"],
)
def test_chunk_faults_are_recovered(fault: Fault, s3_bucket: Bucket, tmp_path: Path) -> None:
    path = make_pack(tmp_path / "a.h5", compression=Compression(codec="lz4"), chunk_samples=8)
    url = s3_bucket.put(path, "a.h5")
    with reader(url, s3_bucket) as remote, PackReader(path) as local:
        s3_bucket.proxy.reset_counts()
        s3_bucket.proxy.inject(fault, times=2)
        assert everything(remote) == everything(local)
        assert s3_bucket.proxy.counts.gets == remote.chunk_map.num_chunks + 2


def test_chunk_faults_past_the_retries_name_url_and_chunk(
    s3_bucket: Bucket, tmp_path: Path
) -> None:
    path = make_pack(tmp_path / "a.h5", compression=Compression(codec="lz4"), chunk_samples=8)
    url = s3_bucket.put(path, "a.h5")
    options = {**s3_bucket.storage_options, "attempts": 2}
    with PackReader(url, ReaderOptions(storage_options=options)) as remote:
        s3_bucket.proxy.inject(Fault("status", status=500), times=2)
        with pytest.raises(RemoteError, match=r"chunk\(s\) 0: s3://.*a\.h5: bytes") as err:
            remote.read_stored([0])
        assert "last cause: HTTP 500" in str(err.value)


def test_missing_pack_is_one_error_at_open(s3_bucket: Bucket) -> None:
    with pytest.raises(PackNotFoundError, match=r"s3://.*/nope\.h5: no such object"):
        reader(s3_bucket.url("nope.h5"), s3_bucket)


def test_damaged_index_is_refused(s3_bucket: Bucket, tmp_path: Path) -> None:
    path = make_pack(tmp_path / "a.h5")
    data = bytearray(path.read_bytes())
    data[-FOOTER_BYTES - 20] ^= 0xFF  # inside the main section
    path.write_bytes(bytes(data))
    url = s3_bucket.put(path, "a.h5")
    with pytest.raises(FormatError, match="compact index does not match its CRC32"):
        reader(url, s3_bucket)


# -- pack sets and the training side -------------------------------------------------------
def remote_set(
    bucket: Bucket, tmp_path: Path, shards: int = 3, samples: int = 30
) -> tuple[Path, str]:
    from h5pack.write.options import ConvertOptions
    from h5pack.write.shards import convert_set

    folder = tmp_path / "images"
    for i, image in enumerate(arrays(samples, (8, 8, 3))):
        (folder / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        (folder / f"c{i % 3}" / f"{i}.jpg").write_bytes(jpeg(image))
    local = tmp_path / "set"
    options = ConvertOptions(
        mode="raw", size=(8, 8), chunk_samples=4, compression=Compression(codec="lz4")
    )
    convert_set(folder, local, options, shards=shards)
    return local, bucket.put_tree(local, "set")


def test_the_frozen_set_reads_remotely(s3_bucket: Bucket) -> None:
    from h5pack.read.setreader import open_reader

    url = s3_bucket.put_tree(DATA / "v1_1_set", "frozen")
    options = ReaderOptions(storage_options=s3_bucket.storage_options, window_chunks=64)
    with open_reader(url, options) as remote, open_reader(DATA / "v1_1_set") as local:
        assert everything(remote) == everything(local)


def test_remote_set_opens_in_two_requests_per_shard(s3_bucket: Bucket, tmp_path: Path) -> None:
    from h5pack.read.setreader import open_reader

    local, url = remote_set(s3_bucket, tmp_path, shards=4)
    for given in (url, url + "packset.json"):
        s3_bucket.proxy.reset_counts()
        options = ReaderOptions(storage_options=s3_bucket.storage_options, window_chunks=64)
        with open_reader(given, options) as remote, open_reader(local) as expected:
            assert s3_bucket.proxy.counts.total <= 1 + 2 * 4  # the manifest, then each shard
            assert everything(remote) == everything(expected)


def epoch(loader: object) -> list[tuple[bytes, list[int], list[str]]]:
    batches = []
    for images, labels, paths in loader:  # type: ignore[attr-defined]
        batches.append((images.numpy().tobytes(), labels.tolist(), list(paths)))
    return batches


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["pack", "set"])
def test_loader_reads_a_remote_source_as_the_local_one(
    kind: str, num_workers: int, s3_bucket: Bucket, tmp_path: Path
) -> None:
    from h5pack.training.loader import make_loader

    if kind == "pack":
        local: Path = make_pack(
            tmp_path / "a.h5", compression=Compression(codec="lz4"), chunk_samples=4
        )
        url = s3_bucket.put(local, "a.h5")
    else:
        local, url = remote_set(s3_bucket, tmp_path)
    settings = {"num_workers": num_workers, "seed": 3, "return_path": True}
    batch = EpochSpec(batch_size=5, window_chunks=2)
    remote = make_loader(url, batch, storage_options=s3_bucket.storage_options, **settings)
    expected = make_loader(local, batch, **settings)
    for number in (0, 1):
        remote.set_epoch(number)
        expected.set_epoch(number)
        got, want = epoch(remote), epoch(expected)
        assert got == want
        paths = [p for _, _, batch in got for p in batch]
        assert sorted(paths) == sorted(set(paths))  # every sample once
        assert len(paths) == len(remote.dataset)


# -- the command line ----------------------------------------------------------------------
def storage_flags(bucket: Bucket) -> list[str]:
    flags = []
    for key, value in bucket.storage_options.items():
        flags += ["--storage-option", f"{key}={value}"]
    return flags


def test_cli_info_and_verify_of_a_remote_pack(s3_bucket: Bucket, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from h5pack.cli.main import cli

    path = make_pack(tmp_path / "a.h5", compression=Compression(codec="lz4"), chunk_samples=8)
    url = s3_bucket.put(path, "a.h5")
    runner = CliRunner()
    remote = runner.invoke(cli, ["info", "--json", url, *storage_flags(s3_bucket)])
    local = runner.invoke(cli, ["info", "--json", str(path)])
    assert remote.exit_code == 0, remote.output
    import json

    got, want = json.loads(remote.output), json.loads(local.output)
    assert got.pop("path") == url
    want.pop("path")
    assert got == want
    result = runner.invoke(cli, ["verify", url, "-q", *storage_flags(s3_bucket)])
    assert result.exit_code == 0, result.output
    assert "37 of 37 samples verified" in result.output
    missing = runner.invoke(cli, ["info", s3_bucket.url("nope.h5"), *storage_flags(s3_bucket)])
    assert missing.exit_code == 1
    assert "no such object" in missing.output
    assert "Traceback" not in missing.output
    bad = runner.invoke(cli, ["info", url, "--storage-option", "endpoint"])
    assert bad.exit_code == 2
    assert "KEY=VALUE" in bad.output


def test_cli_info_of_a_remote_set(s3_bucket: Bucket, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from h5pack.cli.main import cli

    _, url = remote_set(s3_bucket, tmp_path)
    result = CliRunner().invoke(cli, ["info", url, *storage_flags(s3_bucket)])
    assert result.exit_code == 0, result.output
    assert "packset.json" in result.output
    assert "30" in result.output


def test_the_environment_configures_urls_for_samplers_and_streams(
    s3_bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from h5pack.training.dataset import H5IterableDataset
    from h5pack.training.sampler import ChunkBatchSampler, EpochSpec

    path = make_pack(tmp_path / "a.h5", compression=Compression(codec="lz4"), chunk_samples=4)
    url = s3_bucket.put(path, "a.h5")
    options = s3_bucket.storage_options
    monkeypatch.setenv("AWS_ENDPOINT_URL", str(options["endpoint"]))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", str(options["access_key_id"]))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", str(options["secret_access_key"]))
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    sampler = ChunkBatchSampler(url, batch_size=4, seed=1)
    assert sorted(i for batch in sampler for i in batch) == list(range(37))
    stream = H5IterableDataset(url, EpochSpec(batch_size=4, seed=2, window_chunks=2))
    local = H5IterableDataset(path, EpochSpec(batch_size=4, seed=2, window_chunks=2))
    got = [(image.numpy().tobytes(), int(label)) for image, label in stream]
    want = [(image.numpy().tobytes(), int(label)) for image, label in local]
    assert got == want
    assert len(got) == 37


def test_cli_bench_of_a_remote_pack_reads_the_environment(
    s3_bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from h5pack.cli.main import cli

    path = make_pack(tmp_path / "a.h5", compression=Compression(codec="lz4"), chunk_samples=8)
    url = s3_bucket.put(path, "a.h5")
    options = s3_bucket.storage_options
    monkeypatch.setenv("AWS_ENDPOINT_URL", str(options["endpoint"]))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", str(options["access_key_id"]))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", str(options["secret_access_key"]))
    args = ["bench", url, "--workers", "0", "--repeats", "1", "--warmup", "0", "-q"]
    result = CliRunner().invoke(cli, [*args, "--time-budget", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert url in result.output


def test_two_simulated_ranks_share_a_remote_set_exactly_once(
    s3_bucket: Bucket, tmp_path: Path
) -> None:
    from h5pack.training.loader import make_loader

    _, url = remote_set(s3_bucket, tmp_path)
    seen: list[str] = []
    lengths = set()
    for rank in (0, 1):
        loader = make_loader(
            url,
            EpochSpec(batch_size=4, num_replicas=2, rank=rank),
            num_workers=0,
            seed=5,
            drop_last=True,
            return_path=True,
            storage_options=s3_bucket.storage_options,
        )
        paths = [p for _, _, batch in epoch(loader) for p in batch]
        lengths.add(len(paths))
        seen.extend(paths)
    assert len(lengths) == 1  # equal shares
    assert len(seen) == len(set(seen))  # no sample twice across the ranks


@pytest.mark.parametrize("codec", ["lzf", "blosc-zstd", "gzip"])
def test_codecs_the_direct_path_may_not_read_are_read_remotely(
    codec: str, s3_bucket: Bucket, tmp_path: Path
) -> None:
    path = make_pack(tmp_path / "a.h5", compression=Compression(codec=codec), chunk_samples=8)
    url = s3_bucket.put(path, "a.h5")
    with reader(url, s3_bucket, window_chunks=64) as remote, PackReader(path) as local:
        assert everything(remote) == everything(local)


def test_cli_verify_of_a_remote_set(s3_bucket: Bucket, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from h5pack.cli.main import cli

    local, url = remote_set(s3_bucket, tmp_path)
    runner = CliRunner()
    result = runner.invoke(cli, ["verify", url, "-q", *storage_flags(s3_bucket)])
    assert result.exit_code == 0, result.output
    assert "30 of 30 samples verified in 3 shards" in result.output
    (s3_bucket.path / "set" / sorted(p.name for p in local.glob("*.h5"))[1]).unlink()
    s3_bucket.server.forget()
    result = runner.invoke(cli, ["verify", url, "-q", *storage_flags(s3_bucket)])
    assert result.exit_code == 1, result.output
    assert "no such object" in result.output
