"""Sharded conversion on a Dask cluster: one task per shard, the manifest on the client.

The client lists and splits the source once (``shards.open_set``); sizes, when needed,
are probed by one task per shard. Each shard task (``split.ShardTask``) writes its pack
as ``convert_set`` does; workers see the source and output at the client's paths.

NOTE [ One shard per Dask worker process ]: a task converts in its worker's process
(``workers=1``): Dask's daemonic workers cannot start a pool, and the parallelism is
Dask's (``--nthreads 1``, ``LocalCluster(processes=True, threads_per_worker=1)``).
``distributed`` (the ``dask`` extra) is imported when used.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from h5pack._types import StrPath
from h5pack.core.machine import available_cores
from h5pack.core.store import Store
from h5pack.errors import H5PackError, install_line
from h5pack.write.options import ConvertOptions
from h5pack.write.packing import worker_pool
from h5pack.write.pipeline import keep_freed_memory, probe_batch
from h5pack.write.report import ConvertEvent
from h5pack.write.shards import (
    PackSetReport,
    ShardReport,
    open_set,
    set_report,
    write_shard,
)
from h5pack.write.sources import SampleSource
from h5pack.write.sources.base import Image
from h5pack.write.split import ShardTask, needs_probe, plan_reason, remove_leftovers_beside

__all__ = ["convert_on_dask", "dask_client"]

INSTALL_HINT = install_line("dask")

# One shard at a time per process (NOTE [ One shard per Dask worker process ]).
_ONE_SHARD = threading.Lock()


def _distributed() -> Any:
    try:
        import distributed
    except ImportError as err:
        raise H5PackError(
            f"--dask needs Dask's distributed scheduler, which is not installed: {INSTALL_HINT}"
        ) from err
    return distributed


@contextlib.contextmanager
def dask_client(address: str, *, workers: int | None = None) -> Iterator[Any]:
    """Lend a ``distributed.Client`` of the scheduler at ``address``, or of a LocalCluster.

    ``"local"``: a ``LocalCluster`` of ``workers`` one-thread processes (default: a core each).

    Raises:
        H5PackError: ``distributed`` is missing, or the scheduler cannot be reached.
    """
    distributed = _distributed()
    if address == "local":
        import dask

        # NOTE [ Dask's profiler ]: its stack sampling costs a conversion per image
        # (docs/decisions/0025): a LocalCluster's workers start without it.
        with dask.config.set({"distributed.worker.profile.enabled": False}):
            cluster = distributed.LocalCluster(
                n_workers=workers or available_cores(),
                threads_per_worker=1,
                processes=True,
                dashboard_address=":0",  # any free port: 8787 may be taken
            )
        with cluster, distributed.Client(cluster) as client:
            yield client
        return
    try:
        client = distributed.Client(address, timeout="30s")
    except (OSError, TimeoutError) as err:
        raise H5PackError(f"cannot reach the Dask scheduler at {address} ({err})") from err
    with client:
        yield client


def probe_files(items: list[tuple[Image, str]]) -> Counter[tuple[int, int]]:
    """Return how many of the ``(image, key)`` samples have each (H, W) (a Dask task)."""
    return Counter(size for size in probe_batch(items) if size is not None)


def run_shard(task: ShardTask) -> ShardReport:
    """Convert one shard in this process (a Dask task; NOTE [ One shard per Dask worker ...])."""
    with _ONE_SHARD, worker_pool(1, _ignore, _ignore) as pool:
        keep_freed_memory()  # Dask's nanny lowers the trim threshold (NOTE [ Worker malloc ])
        # A task run again after its worker died finds what that worker left.
        if task.remote is None:
            remove_leftovers_beside(task.target, _ignore)
        report, _ = write_shard(task, pool)
    return report


def _ignore(_: Any) -> None:
    return None


def convert_on_dask(
    client: Any,
    source: StrPath | SampleSource,
    out_dir: StrPath,
    options: ConvertOptions | None = None,
    *,
    shards: int,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    on_event: Callable[[ConvertEvent], None] | None = None,
    storage_options: Mapping[str, str] | None = None,
    store: Store | None = None,
    staging_dir: StrPath | None = None,
) -> PackSetReport:
    """Pack ``source`` into a pack set of ``shards`` shards, one Dask task per shard.

    As ``convert_set``, but ``options.workers`` is unused (each task runs in its worker) and
    ``progress`` counts each shard's images as it completes. The ``client``'s workers must
    see ``source`` and ``out_dir`` at the same paths; into a bucket, each task stages and
    uploads its shard (the workers' environment is read where they run).

    Raises:
        TargetExistsError: a shard exists that does not match, without ``overwrite``.
        H5PackError: a task failed (its error is raised here).
    """
    options = options or ConvertOptions()
    emit = on_event or _ignore
    step = progress or _ignore
    started = time.perf_counter()
    distributed = _distributed()
    out, remote, split = open_set(
        source,
        out_dir,
        options,
        shards,
        overwrite=overwrite,
        storage_options=storage_options,
        store=store,
        staging_dir=staging_dir,
        emit=emit,
    )
    if remote is None:
        out = Path(os.path.abspath(out))  # the workers may run elsewhere
    sizes: Counter[tuple[int, int]] | None = None
    if needs_probe(options):
        emit(ConvertEvent("note", f"reading image sizes in {shards} Dask tasks"))
        slices = [[(s.image, s.key) for s in split.samples(i)] for i in range(shards)]
        sizes = sum(client.gather(client.map(probe_files, slices, pure=False)), Counter())
    tasks = split.tasks(list(range(shards)), out, remote, sizes=sizes, overwrite=overwrite)
    reason = plan_reason(tasks[0], len(split))
    emit(ConvertEvent("mode", reason))
    emit(ConvertEvent("phase", f"converting {shards} shards on Dask", total=len(split)))
    futures = client.map(run_shard, tasks, pure=False)
    reports: dict[int, ShardReport] = {}
    try:
        for future in distributed.as_completed(futures):
            report = future.result()
            reports[report.index] = report
            step(report.num_planned)
    finally:
        client.cancel([f for f in futures if not f.done()])
    done = tuple(reports[i] for i in sorted(reports))
    return set_report(split, out, remote, done, reason, started, metas={}, emit=emit)
