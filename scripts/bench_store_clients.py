"""Clients for gs:// and az:// compared per chunk GET: the official SDK (h5pack's store) and fsspec.

On the local servers of the tests (gcp-storage-emulator, Azurite: tests/servers.py; run from
the checkout). For each cloud and candidate: requests per ranged GET (counted by a proxy),
client CPU per GET (process time, straight to the server: the proxy's threads not counted)
and wall time, medians of ``--rounds``; then whether a forked child's first GET returns
after the parent has made requests (the obstore hang, docs/decisions/0017). Each candidate
runs in a process of its own.

    python scripts/bench_store_clients.py --gets 200 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # else 60 s over gRPC at first use

from h5pack.core.store import open_store
from tests.s3local import FaultProxy
from tests.servers import AzuriteServer, GCSServer, Place

Get = Callable[[int, int], bytes]


def candidate(cloud: str, name: str, endpoint: str) -> Get:
    """Return a ranged GET of ``bench/d.bin`` by candidate ``name`` of ``cloud`` at ``endpoint``."""
    if cloud == "gs":
        if name == "sdk":
            source = open_store("gs://", {"endpoint_url": endpoint}).source("gs://bench/d.bin")
            return lambda start, end: bytes(source.read(start, end))
        import gcsfs

        fs = gcsfs.GCSFileSystem(endpoint_url=endpoint, token="anon", project="h5pack")
    else:
        connection = AzuriteServer.connection_string_at(endpoint)
        if name == "sdk":
            store = open_store("az://", {"connection_string": connection})
            source = store.source("az://bench/d.bin")
            return lambda start, end: bytes(source.read(start, end))
        import adlfs

        fs = adlfs.AzureBlobFileSystem(connection_string=connection)
    return lambda start, end: bytes(fs.cat_file("bench/d.bin", start, end))


def per_get(get: Get, size: int, gets: int, rounds: int) -> tuple[float, float]:
    """Return the median client CPU and wall milliseconds of one ranged GET of ``size``."""
    cpu, wall = [], []
    for _ in range(rounds):
        c0, w0 = time.process_time(), time.perf_counter()
        for i in range(gets):
            start = (i % 8) * size
            assert len(get(start, start + size)) == size
        cpu.append((time.process_time() - c0) / gets * 1e3)
        wall.append((time.perf_counter() - w0) / gets * 1e3)
    return statistics.median(cpu), statistics.median(wall)


def survives_fork(get: Get) -> bool:
    """Return whether a forked child's first GET returns within 20 s."""
    pid = os.fork()
    if pid == 0:
        get(0, 1024)
        os._exit(0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status == 0
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return False


def one(cloud: str, name: str, server: str, gets: int, rounds: int) -> None:
    """Measure one candidate (in a process of its own: a hang is its own timeout)."""
    with FaultProxy(server) as proxy:
        counted = candidate(cloud, name, proxy.endpoint)
        counted(0, 1024)  # the client made, the object's identity known
        proxy.reset_counts()
        counted(0, 2**20)
        requests = proxy.reset_counts().total
    get = candidate(cloud, name, server)
    line = [f"{cloud} {name:6s} requests per GET {requests}"]
    for size in (64 * 2**10, 2**20):
        cpu, wall = per_get(get, size, gets, rounds)
        line.append(f"{size >> 10:4d} KiB: CPU {cpu:.2f} ms, wall {wall:.2f} ms")
    line.append(f"forked child {'ok' if survives_fork(get) else 'HANGS'}")
    print(" | ".join(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gets", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", nargs=3, metavar=("CLOUD", "CANDIDATE", "SERVER"))
    args = parser.parse_args()
    if args.one:
        one(*args.one, args.gets, args.rounds)
        return
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "d.bin"
        data.write_bytes(os.urandom(8 * 2**20))
        for server_type in (GCSServer, AzuriteServer):
            with server_type(Path(folder)) as server, FaultProxy(server.endpoint) as proxy:
                place = Place(server, "bench", proxy)
                place.put(data, "d.bin")
                for name in ("sdk", "fsspec"):
                    command = [sys.executable, __file__, "--one", place.scheme, name]
                    command += [server.endpoint, "--gets", str(args.gets)]
                    command += ["--rounds", str(args.rounds)]
                    try:
                        subprocess.run(command, timeout=240, check=False)
                    except subprocess.TimeoutExpired:
                        print(f"{place.scheme} {name:6s} did not finish in 240 s", flush=True)


if __name__ == "__main__":
    main()
