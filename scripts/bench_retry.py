"""Retries by time against the old count of tries, and what a checked upload costs.

1. A request throttled (503 SlowDown) for ``T`` seconds, simulated with an injected clock
   (no real waiting): the share of draws of the jitter that outlast it, the attempts it
   takes and how long after the throttling ends it succeeds, for the default
   ``RetryPolicy`` and for the policy it replaced (5 attempts, 0.1 s doubled to 5 s,
   jitter in [0.5, 1)).
2. MD5 (Content-MD5 and the ETag's comparison) of a 16 MiB part, MiB per CPU second,
   beside the SHA-256 botocore already computes of every body.

    python scripts/bench_retry.py --draws 2000
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import time

from h5pack.core.retry import RetriesExhaustedError, RetryPolicy, Transient, retrying


class Clock:
    """A clock only ``sleep`` moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        """Return the time."""
        return self.now

    def sleep(self, seconds: float) -> None:
        """Move the time on."""
        self.now += seconds


def by_time(throttle_s: float, rng: random.Random) -> tuple[bool, int, float]:
    """Return (outlasted, attempts, seconds after the throttling) of the default policy."""
    clock, attempts = Clock(), [0]

    def attempt() -> float:
        attempts[0] += 1
        if clock.now < throttle_s:
            raise RuntimeError("503 SlowDown")
        return clock.now

    def classify(err: Exception) -> Transient:
        return Transient("HTTP 503 SlowDown", throttled=True)

    try:
        done = retrying(
            RetryPolicy(),
            attempt,
            classify,
            what="x",
            clock=clock,
            sleep=clock.sleep,
            draw=rng.random,
        )
    except RetriesExhaustedError:
        return False, attempts[0], clock.now - throttle_s
    return True, attempts[0], done - throttle_s


def by_count(throttle_s: float, rng: random.Random) -> tuple[bool, int, float]:
    """The same for the policy it replaced."""
    now = 0.0
    for number in range(5):
        if number:
            now += min(5.0, 0.1 * 2 ** (number - 1)) * (0.5 + rng.random() / 2)
        if now >= throttle_s:
            return True, number + 1, now - throttle_s
    return False, 5, now - throttle_s


def main() -> None:
    """Print the table and the MD5 rate."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000)
    args = parser.parse_args()
    rng = random.Random(0)
    print("throttle_s  policy    outlasted  attempts(median)  late_s(median)")
    for throttle_s in (3.0, 10.0, 30.0, 50.0):
        for name, run in (("by time", by_time), ("by count", by_count)):
            runs = [run(throttle_s, rng) for _ in range(args.draws)]
            won = [r for r in runs if r[0]]
            share = len(won) / len(runs)
            attempts = statistics.median(r[1] for r in runs)
            late = statistics.median(r[2] for r in won) if won else float("nan")
            print(f"{throttle_s:10.0f}  {name:8}  {share:9.1%}  {attempts:16.0f}  {late:14.2f}")
    part = random.Random(1).randbytes(16 * 2**20)
    rates = []
    for name in ("md5", "sha256"):  # botocore hashes each body with SHA-256 (and CRC32)
        start = time.process_time()
        for _ in range(8):
            hashlib.new(name, part).digest()
        rates.append(f"{name} {8 * 16 / (time.process_time() - start):.0f}")
    print(f"MiB per CPU second over 16 MiB parts: {', '.join(rates)}")


if __name__ == "__main__":
    main()
