"""A remote pack set under torch.distributed (gloo): every sample once over the ranks.

Two ranks (forked by ``torch.multiprocessing``, as tests/test_packset_training.py starts
them) read one set from the local S3 server with workers 0 and 2, each beside a loader
over the local copy with the same settings.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from h5pack.training.epochs import EpochSpec
from h5pack.training.loader import make_loader
from tests.s3local import Bucket
from tests.test_remote import remote_set

NUM_SAMPLES = 29  # odd over 2 ranks: one sample of padding


def _epoch(loader: Any) -> list[list[tuple[str, int, str]]]:
    """Every batch as (path, label, digest of the pixels) per sample."""
    batches = []
    for images, labels, paths in loader:
        batches.append(
            [
                (path, int(label), hashlib.sha256(image.numpy().tobytes()).hexdigest())
                for image, label, path in zip(images, labels, paths, strict=True)
            ]
        )
    return batches


def _rank_main(rank: int, world: int, local: str, url: str, storage: Any, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world
    )
    try:
        result = {}
        for num_workers in (0, 2):
            settings = {"num_workers": num_workers, "seed": 5, "return_path": True}
            batch = EpochSpec(batch_size=3, window_chunks=2)
            remote = make_loader(url, batch, storage_options=storage, **settings)
            copy = make_loader(local, batch, **settings)
            remote.set_epoch(1)
            copy.set_epoch(1)
            result[str(num_workers)] = {
                "len": len(remote),
                "remote": _epoch(remote),
                "local": _epoch(copy),
            }
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("no_aws_environment")
def test_a_remote_set_under_torch_distributed(s3_bucket: Bucket, tmp_path: Path) -> None:
    local, url = remote_set(s3_bucket, tmp_path, shards=3, samples=NUM_SAMPLES)
    world = 2
    s3_bucket.proxy.reset_counts()
    # fork: the ranks start without importing torch again; each builds its own client
    mp.start_processes(
        _rank_main,
        args=(world, str(local), url, dict(s3_bucket.storage_options), str(tmp_path)),
        nprocs=world,
        join=True,
        start_method="fork",
    )
    assert s3_bucket.proxy.counts.gets > 0  # the ranks read through the server
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for num_workers in ("0", "2"):
        runs = [r[num_workers] for r in results]
        for run in runs:
            # the same batches, pixels and labels as the local copy's loader on that rank
            assert run["remote"] == run["local"]
            assert run["len"] == len(run["remote"])
        assert len({len(run["remote"]) for run in runs}) == 1  # equal batches on every rank
        served = Counter(s[0] for run in runs for batch in run["remote"] for s in batch)
        assert len(served) == NUM_SAMPLES  # every sample, over the ranks
        # padding (sampler note "Ranks"): ceil(N / R) per rank, the extra R*ceil(N/R) - N
        # samples served twice
        padding = world * -(-NUM_SAMPLES // world) - NUM_SAMPLES
        assert padding == 1
        assert sum(served.values()) == NUM_SAMPLES + padding
        assert sorted(served.values()).count(2) == padding
        # a sample read twice is the same pixels and label both times
        seen: dict[str, tuple[int, str]] = {}
        for run in runs:
            for batch in run["remote"]:
                for path, label, digest in batch:
                    assert seen.setdefault(path, (label, digest)) == (label, digest)
