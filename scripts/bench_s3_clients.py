"""Which S3 client reads ranges fastest from the local server (issue 17: the client choice).

    python scripts/bench_s3_clients.py [--rounds 3]
    python scripts/bench_s3_clients.py --only cpu --rounds 5

``clients``: serial small ranged GETs (latency), 1 MiB ranges with 8 in flight, 8 MiB ranges
serial (bandwidth), and the client's import time; medians of rounds, on ``rclone serve s3``
through the counting proxy (obstore needs its 206 answers, NOTE [ rclone's ranged answers ]).

``cpu``: CPU time per ranged GET of a chunk-sized range (``--range-mib``, 8 in flight),
h5pack's ``S3Source`` with ``ranged_gets="botocore"`` (botocore's ``get_object``) against
``"lean"`` (NOTE [ The lean ranged GET ]), side by side in each round, straight to rclone
(no proxy in this process to count): this process's CPU (user + system, the socket's copy
included) and the server's (``/proc/PID/stat`` of rclone), per GET.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from h5pack.bench.s3local import FaultProxy, S3Server

MIB = 2**20


def clients(
    server: S3Server, endpoint: str
) -> dict[str, Callable[[], Callable[[int, int], bytes]]]:
    def obstore_client() -> Callable[[int, int], bytes]:
        import obstore
        from obstore.store import S3Store

        store = S3Store(
            "bench",
            endpoint=endpoint,
            access_key_id=server.access_key,
            secret_access_key=server.secret_key,
            region="us-east-1",
            client_options={"allow_http": True},
        )
        return lambda lo, hi: bytes(obstore.get_range(store, "blob.bin", start=lo, end=hi))

    def boto3_client() -> Callable[[int, int], bytes]:
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=server.access_key,
            aws_secret_access_key=server.secret_key,
            region_name="us-east-1",
        )
        return lambda lo, hi: s3.get_object(
            Bucket="bench", Key="blob.bin", Range=f"bytes={lo}-{hi - 1}"
        )["Body"].read()

    def s3fs_client() -> Callable[[int, int], bytes]:
        import s3fs

        fs = s3fs.S3FileSystem(
            key=server.access_key,
            secret=server.secret_key,
            endpoint_url=endpoint,
            client_kwargs={"region_name": "us-east-1"},
        )
        return lambda lo, hi: fs.cat_file("bench/blob.bin", start=lo, end=hi)

    return {"obstore": obstore_client, "boto3": boto3_client, "s3fs": s3fs_client}


def measure(read: Callable[[int, int], bytes], size: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    small = rng.integers(0, size - 4096, 40).tolist()
    t0 = time.perf_counter()
    for lo in small:
        assert len(read(lo, lo + 4096)) == 4096
    latency = (time.perf_counter() - t0) / len(small)
    mid = rng.integers(0, size - MIB, 64).tolist()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda lo: len(read(lo, lo + MIB)), mid))
    assert got == [MIB] * 64
    parallel = 64 * MIB / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for lo in range(0, 8 * 8 * MIB, 8 * MIB):
        assert len(read(lo, lo + 8 * MIB)) == 8 * MIB
    serial = 8 * 8 * MIB / (time.perf_counter() - t0)
    return {"latency_ms": latency * 1e3, "mib_s_8x1m": parallel / MIB, "mib_s_8m": serial / MIB}


def process_cpu_s(pid: int) -> float:
    """Return the user + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_get(rounds: int, range_mib: float) -> None:
    from h5pack.core.s3 import S3Source, resolve_options

    with tempfile.TemporaryDirectory() as root, S3Server(root) as server:
        size = 64 * MIB
        blob = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
        (server.bucket("bench") / "blob.bin").write_bytes(blob.tobytes())
        server.forget()
        span = int(range_mib * MIB)
        starts = np.random.default_rng(0).integers(0, size - span, 64).tolist()
        ranges = [(lo, lo + span) for lo in starts]
        arms = {}
        for path in ("botocore", "lean"):
            options = {**server.storage_options(), "max_in_flight": 8, "ranged_gets": path}
            arms[path] = S3Source("s3://bench/blob.bin", resolve_options(options))
            got = arms[path].read_ranges(ranges[:2])  # the client made, identity learned
            assert bytes(got[1]) == blob[ranges[1][0] : ranges[1][1]].tobytes()
        server_pid = server.pid
        rows: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in arms}
        for _ in range(rounds):
            for name, source in arms.items():  # side by side, each round
                before = resource.getrusage(resource.RUSAGE_SELF)
                served, wall = process_cpu_s(server_pid), time.perf_counter()
                got = source.read_ranges(ranges)
                wall = time.perf_counter() - wall
                after = resource.getrusage(resource.RUSAGE_SELF)
                assert [len(g) for g in got] == [span] * len(ranges)
                rows[name].append(
                    (
                        (after.ru_utime - before.ru_utime) / len(ranges),
                        (after.ru_stime - before.ru_stime) / len(ranges),
                        (process_cpu_s(server_pid) - served) / len(ranges),
                        len(ranges) * span / wall / MIB,
                    )
                )
        print(
            f"CPU per ranged GET of {range_mib} MiB, 8 in flight, straight to rclone, "
            f"medians of {rounds} rounds (client: user + system, the socket's copy is system)"
        )
        print("ranged_gets   client ms CPU/GET (user, system)   server ms CPU/GET   MiB/s")
        for name, results in rows.items():
            user, system, serving, rate = (
                statistics.median(r[k] for r in results) for k in range(4)
            )
            print(
                f"{name:12s} {(user + system) * 1e3:9.2f} ({user * 1e3:.2f}, {system * 1e3:.2f})"
                f"{serving * 1e3:27.2f} {rate:7.0f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["clients", "cpu"], default=None)
    parser.add_argument("--range-mib", type=float, default=1.7, help="the cpu part's GETs")
    args = parser.parse_args()
    if args.only != "clients":
        cpu_per_get(args.rounds, args.range_mib)
    if args.only == "cpu":
        return
    with (
        tempfile.TemporaryDirectory() as root,
        S3Server(root) as server,
        FaultProxy(server.endpoint) as proxy,
    ):
        size = 64 * MIB
        blob = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
        (server.bucket("bench") / "blob.bin").write_bytes(blob.tobytes())
        readers = {}
        for name, make in clients(server, proxy.endpoint).items():
            t0 = time.perf_counter()
            readers[name] = make()
            readers[name](0, 16)
            print(f"{name}: import + first GET {1e3 * (time.perf_counter() - t0):.0f} ms")
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in readers}
        for _ in range(args.rounds):
            for name, read in readers.items():  # side by side, each round
                rows[name].append(measure(read, size))
        print("client   ms/small GET   MiB/s 1MiB x8 in flight   MiB/s 8MiB serial")
        for name, results in rows.items():
            med = {k: statistics.median(r[k] for r in results) for k in results[0]}
            print(
                f"{name:8s} {med['latency_ms']:13.1f} {med['mib_s_8x1m']:25.0f} "
                f"{med['mib_s_8m']:19.0f}"
            )


if __name__ == "__main__":
    main()
