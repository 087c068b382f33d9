"""GCS, Azure and HTTP(S) stores (issue 28 item 9) beside S3, on local servers, requests counted.

Every test runs once per store (the ``place`` fixture: ``s3``, ``gs``, ``az``, ``http``), so
what S3 meets (tests/test_remote*.py, test_upload.py) is asserted of each store alike.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from h5pack.bench.s3local import Bucket
from h5pack.core.layout import Compression
from h5pack.read.reader import PackReader, ReaderOptions
from tests.helpers import make_pack, random_arrays
from tests.servers import Place

Somewhere = Bucket | Place


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
