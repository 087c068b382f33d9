"""GCS, Azure and HTTP(S) stores (issue 28 item 9) beside S3, on local servers, requests counted.

Every test runs once per store (the ``place`` fixture: ``s3``, ``gs``, ``az``, ``http``), so
what S3 meets (tests/test_remote*.py, test_upload.py) is asserted of each store alike.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from h5pack import ConvertOptions, TargetExistsError, convert, convert_set, merge_packs
from h5pack.core.layout import Compression
from h5pack.core.source import SourceChangedError
from h5pack.core.store import open_store
from h5pack.errors import (
    FormatError,
    H5PackError,
    OptionsError,
    PackNotFoundError,
    RemoteError,
)
from h5pack.read.reader import PackReader, ReaderOptions
from h5pack.read.setreader import open_reader
from h5pack.synthetic import SampleSpec, make_image_folder
from h5pack.training.epochs import EpochSpec
from h5pack.training.loader import make_loader
from tests.helpers import arrays, contents, make_pack, random_arrays
from tests.s3local import Bucket, Fault
from tests.servers import AZURITE_KEY, Place

Somewhere = Bucket | Place
ONE = ConvertOptions(workers=1)


def everything(pack: PackReader) -> tuple[list[bytes], list[int], list[str]]:
    stored = pack.read_stored(np.arange(len(pack)))
    return [s.tobytes() for s in stored], pack.meta.labels.tolist(), list(pack.paths)


def test_a_pack_opens_in_few_requests_and_reads_one_get_per_chunk(
    place: Somewhere, tmp_path: Path
) -> None:
    samples = random_arrays(300, (16, 16, 3))
    path = make_pack(
        tmp_path / "a.h5", samples=samples, compression=Compression(codec="zstd"), chunk_samples=16
    )
    url = place.put(path, "a.h5")
    options = ReaderOptions(storage_options=place.storage_options, window_chunks=4)
    with PackReader(url, options) as remote, PackReader(path) as local:
        assert place.proxy.reset_counts().total <= 4
        order = np.random.default_rng(0).permutation(len(remote))
        for chunk in np.unique(remote.chunk_map.chunks_of(order)).tolist():
            remote.read_stored(list(remote.chunk_map.samples(chunk)))
        assert place.proxy.counts.gets == remote.chunk_map.num_chunks
        assert everything(remote) == everything(local)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 small JPEGs in 4 classes."""
    root = tmp_path_factory.mktemp("stores") / "images"
    make_image_folder(root, SampleSpec(num_images=40, num_classes=4, size=(12, 16)))
    return root


@pytest.fixture(scope="module")
def local_set(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder converted into a local set of 3 packs: the reference."""
    target = tmp_path_factory.mktemp("set") / "set"
    convert_set(folder, target, ONE, shards=3)
    return target


def epochs(
    loader: object, count: int, place: Somewhere | None = None, most: int = 0
) -> list[list[object]]:
    """Return each epoch's (label, pixels); with ``place``, its GETs: epoch 1 ``most``, then 0."""
    found = []
    for epoch in range(count):
        loader.set_epoch(epoch)  # type: ignore[attr-defined]
        seen = []
        for images, labels in loader:  # type: ignore[attr-defined]
            seen.extend(zip(labels.tolist(), [i.numpy().tobytes() for i in images], strict=True))
        found.append(seen)
        if place is not None:
            gets = place.proxy.reset_counts().gets
            assert gets == 0 if epoch else 0 < gets <= most  # epoch 2 on: from the disk cache
    return found


def loaders(source: Path, url: str, place: Somewhere, cache: Path, workers: int) -> list[object]:
    common = dict(
        batch_size=EpochSpec(batch_size=8, window_chunks=2),
        num_workers=workers,
        seed=3,
        multiprocessing_context="fork" if workers else None,
    )
    local = make_loader(source, **common)
    remote = make_loader(
        url,
        storage_options=place.storage_options,
        reader=ReaderOptions(disk_cache_dir=cache, disk_cache_bytes=10**8),
        **common,
    )
    return [local, remote]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pack_trains_with_one_get_per_chunk_then_none(
    place: Somewhere, tmp_path: Path, workers: int
) -> None:
    path = make_pack(
        tmp_path / "p.h5",
        samples=arrays(90, shape=(16, 16, 3)),
        chunk_samples=6,
        compression=Compression(codec="zstd"),
    )
    url = place.put(path, "p.h5")
    local, remote = loaders(path, url, place, tmp_path / "cache", workers)
    place.proxy.reset_counts()
    # a GET per chunk (15), and at most 4 requests per process that opens the pack
    assert epochs(remote, 3, place, 15 + 4 * max(1, workers)) == epochs(local, 3)


def test_a_pack_set_trains_from_the_cache_in_epoch_two(
    place: Somewhere, local_set: Path, tmp_path: Path
) -> None:
    url = place.put_tree(local_set, "set")
    local, remote = loaders(local_set, url, place, tmp_path / "cache", 0)
    place.proxy.reset_counts()
    chunks = 0
    for pack in sorted(local_set.glob("*.h5")):
        with PackReader(pack) as reader:
            chunks += reader.chunk_map.num_chunks
    assert epochs(remote, 3, place, chunks + 4 * 3) == epochs(local, 3)
    with open_reader(url, ReaderOptions(storage_options=place.storage_options)) as reader:
        assert place.proxy.reset_counts().total <= 2 + 4 * 3  # the manifest, then each pack
        images = reader.read_images(range(reader.meta.num_samples))
        assert [i.tobytes() for i in images] == [c[3] for c in contents(local_set)]


def test_convert_and_merge_write_into_the_store(
    place: Somewhere, folder: Path, local_set: Path, tmp_path: Path
) -> None:
    options = place.storage_options
    if isinstance(place, Place) and place.scheme == "http":
        with pytest.raises(H5PackError, match=r"http://.*/one\.h5: HTTP\(S\) URLs are read-only"):
            convert(folder, place.url("one.h5"), ONE, storage_options=options)
        return
    staging = tmp_path / "staging"
    staging.mkdir()
    report = convert(folder, place.url("one.h5"), ONE, storage_options=options, staging_dir=staging)
    assert report.path == place.url("one.h5")
    convert_set(
        folder, place.url("set/"), ONE, shards=3, storage_options=options, staging_dir=staging
    )
    merged = merge_packs(
        place.url("set/"), place.url("merged.h5"), storage_options=options, staging_dir=staging
    )
    assert merged.path == place.url("merged.h5")
    store = open_store(place.url(), options)
    merge_packs(local_set, tmp_path / "reference.h5")
    for key, reference in (("one.h5", local_set), ("merged.h5", tmp_path / "reference.h5")):
        store.download(place.url(key), tmp_path / key)
        assert contents(tmp_path / key) == contents(reference)
    with pytest.raises(TargetExistsError, match=rf"{place.url('one.h5')} already exists"):
        convert(folder, place.url("one.h5"), ONE, storage_options=options, staging_dir=staging)
    assert list(staging.iterdir()) == []


# rclone and gcp-storage-emulator ignore the condition (AWS and GCS honour it); HTTP is read-only
@pytest.mark.parametrize("place", ["az"], indirect=True)
def test_a_publish_that_must_not_replace_is_conditional(place: Somewhere, tmp_path: Path) -> None:
    """The upload itself refuses an object that appeared after the check (If-None-Match)."""
    store = open_store(place.url(), place.storage_options)
    (tmp_path / "a").write_bytes(b"first")
    (tmp_path / "b").write_bytes(b"second")
    store.publish(tmp_path / "a", place.url("k"), if_absent=True)
    with pytest.raises(TargetExistsError, match="appeared meanwhile"):
        store.publish(tmp_path / "b", place.url("k"), if_absent=True)
    assert store.get(place.url("k")) == b"first"
    store.publish(tmp_path / "b", place.url("k"), if_absent=False)
    assert store.get(place.url("k")) == b"second"


@pytest.mark.parametrize(
    "fault",
    [Fault("reset"), Fault("status", status=503), Fault("truncate", keep_bytes=10)],
    ids=["reset", "503", "truncated"],
)
def test_chunk_faults_are_recovered(place: Somewhere, fault: Fault, tmp_path: Path) -> None:
    path = make_pack(tmp_path / "a.h5", chunk_samples=8, compression=Compression(codec="zstd"))
    url = place.put(path, "a.h5")
    options = ReaderOptions(storage_options=place.storage_options, window_chunks=64)
    with PackReader(url, options) as remote, PackReader(path) as local:
        place.proxy.reset_counts()
        place.proxy.inject(fault, times=2)
        assert everything(remote) == everything(local)
        assert place.proxy.counts.faults == 2
        assert place.proxy.counts.gets == remote.chunk_map.num_chunks + 2


# gcp-storage-emulator ignores ifGenerationMatch and names no generation in its answers
@pytest.mark.parametrize("place", ["s3", "az", "http"], indirect=True)
def test_a_replaced_object_is_refused(place: Somewhere, tmp_path: Path) -> None:
    first = make_pack(tmp_path / "a.h5", chunk_samples=8)
    second = make_pack(tmp_path / "b.h5", samples=arrays(seed=1), chunk_samples=8)
    url = place.put(first, "a.h5")
    options = ReaderOptions(storage_options=place.storage_options)
    with PackReader(url, options) as remote:
        place.put(second, "a.h5")
        with pytest.raises(SourceChangedError, match=r"a\.h5 was replaced"):
            remote.read_stored([0])


def test_missing_objects_and_buckets_are_named(place: Somewhere) -> None:
    options = ReaderOptions(storage_options=place.storage_options)
    with pytest.raises(PackNotFoundError, match=rf"{re.escape(place.url('nope.h5'))}: no such"):
        PackReader(place.url("nope.h5"), options)
    if isinstance(place, Place) and place.scheme == "http":
        return
    url = place.url("x.h5").replace(place.name, "no-such-bucket")
    with pytest.raises(PackNotFoundError, match=rf"{re.escape(url)}: no bucket"):
        PackReader(url, options)


def test_a_fault_that_persists_is_one_error_naming_the_request(
    place: Somewhere, tmp_path: Path
) -> None:
    url = place.put(make_pack(tmp_path / "a.h5", chunk_samples=8), "a.h5")
    options = {**place.storage_options, "max_attempts": 3}
    with PackReader(url, ReaderOptions(storage_options=options)) as remote:
        place.proxy.reset_counts()
        place.proxy.inject(Fault("status", status=500), times=3)
        with pytest.raises(RemoteError, match=rf"{re.escape(url)}.*gave up after 3 attempts"):
            remote.read_stored([0])
        assert place.proxy.counts.gets == 3


@pytest.mark.parametrize("place", ["az"], indirect=True)
def test_no_account_key_in_a_repr_or_an_error(place: Somewhere) -> None:
    store = open_store(place.url(), place.storage_options)
    options = {**place.storage_options, "max_attempts": 2}
    place.proxy.inject(Fault("status", status=500, method=None), times=2)
    with pytest.raises(RemoteError) as failed:
        PackReader(place.url("a.h5"), ReaderOptions(storage_options=options))
    for text in (repr(store.options), str(store.options), str(failed.value)):
        assert AZURITE_KEY not in text
        assert "AccountKey" not in text


def test_one_call_reads_one_kind_of_storage() -> None:
    with pytest.raises(OptionsError, match=r"az://, gs:// URLs in one call"):
        open_store(["gs://a/b.h5", "az://c/d.h5"])
    assert open_store(["http://h/a.h5", "https://h/b.h5"]) == open_store("https://h/c.h5")


@pytest.mark.parametrize("place", ["gs", "az"], indirect=True)
def test_an_upload_damaged_on_the_way_is_sent_again(place: Somewhere, tmp_path: Path) -> None:
    local = tmp_path / "p.bin"
    local.write_bytes(np.random.default_rng(0).integers(0, 256, 50_000, np.uint8).tobytes())
    store = open_store(place.url(), place.storage_options)
    method = "POST" if isinstance(place, Place) and place.scheme == "gs" else "PUT"
    place.proxy.inject(Fault("flip", keep_bytes=20_000, method=method))
    store.publish(local, place.url("p.bin"), if_absent=False)
    assert place.proxy.counts.faults == 1
    assert place.proxy.counts.requests[method] == 2  # the damaged upload, then a good one
    assert store.get(place.url("p.bin")) == local.read_bytes()


def test_settings_come_from_the_environment_and_the_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from h5pack.core.azure import AzureStore
    from h5pack.core.gcs import GCSStore

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "localhost:9023")  # as the SDK takes it
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p")
    gcs = GCSStore.of({"attempts": "3", "retry_timeout_s": "2"}).options
    assert (gcs.endpoint_url, gcs.project, gcs.max_attempts, gcs.retry_timeout_s) == (
        "http://localhost:9023",
        "p",
        3,
        2.0,
    )
    assert GCSStore.of({"endpoint_url": "http://h:1"}).options.endpoint_url == "http://h:1"
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "c2VjcmV0")
    azure = AzureStore.of({"anon": "false"}).options
    assert (azure.account_name, azure.account_key, azure.anon) == ("acct", "c2VjcmV0", False)
    assert "c2VjcmV0" not in repr(azure)
    with pytest.raises(OptionsError, match=r"unknown storage option 'acount_name'; known: .*"):
        AzureStore.of({"acount_name": "x"})


def test_a_web_server_without_ranges_is_refused_by_name(tmp_path: Path) -> None:
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    make_pack(tmp_path / "a.h5", chunk_samples=8)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:  # http.server: no ranges
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/a.h5"
        with pytest.raises(RemoteError, match=rf"{url}: .* does not serve byte ranges"):
            PackReader(url)
        server.shutdown()


def test_an_abfs_url_with_its_account_says_how_to_name_it() -> None:
    from h5pack.core.azure import AzureStore

    store = AzureStore.of({"account_name": "acct", "anon": True})
    with pytest.raises(FormatError, match=r"storage option account_name .* az://c/k\.h5"):
        store.source("abfs://c@acct.dfs.core.windows.net/k.h5")


def test_merge_reads_a_set_in_the_store_into_a_local_pack(
    place: Somewhere, local_set: Path, tmp_path: Path
) -> None:
    url = place.put_tree(local_set, "set")
    merge_packs(local_set, tmp_path / "reference.h5")
    staging = tmp_path / "staging"
    staging.mkdir()
    merge_packs(
        url, tmp_path / "merged.h5", storage_options=place.storage_options, staging_dir=staging
    )
    assert contents(tmp_path / "merged.h5") == contents(tmp_path / "reference.h5")


def test_cli_info_and_verify_read_the_store(place: Somewhere, local_set: Path) -> None:
    from click.testing import CliRunner

    from h5pack.cli.main import cli

    url = place.put_tree(local_set, "set")
    flags = [f"--storage-option={k}={v}" for k, v in place.storage_options.items()]
    for command in (["info", url], ["verify", url]):
        result = CliRunner().invoke(cli, [*command, *flags])
        assert result.exit_code == 0, result.output
    assert "40" in CliRunner().invoke(cli, ["info", url, *flags]).output  # 40 samples


def test_a_pickled_source_keeps_its_identity(place: Somewhere, tmp_path: Path) -> None:
    """A DataLoader worker gets the source pickled: it reads without asking its size again."""
    import pickle

    path = make_pack(tmp_path / "a.h5")
    url = place.put(path, "a.h5")
    source = open_store(url, place.storage_options).source(url)
    identity = source.identity()
    copy = pickle.loads(pickle.dumps(source))
    place.proxy.reset_counts()
    assert copy.identity() == identity
    assert bytes(copy.read(10, 100)) == path.read_bytes()[10:100]
    assert place.proxy.counts.total == 1
    source.close()
    copy.close()
