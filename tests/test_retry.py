"""Retries by time (NOTE [ Retries by time ], h5pack/core/retry.py; issue 28 item 3).

The policy is tested with an injected clock: a fake ``sleep`` advances it, so the counts of
attempts over simulated minutes of throttling take no real time. One end-to-end test
throttles the local S3 server for 10 real seconds and trains through it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from h5pack.core import s3
from h5pack.core.retry import (
    RetriesExhaustedError,
    RetryPolicy,
    Transient,
    retry_after_s,
    retrying,
)
from h5pack.errors import OptionsError, PackNotFoundError
from tests.s3local import Bucket, Fault

MIB = 2**20


class Clock:
    """A monotonic clock that only ``sleep`` moves; it records the waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


class Throttled(Exception):
    pass


def _server_throttling_for(clock: Clock, seconds: float, calls: list[float]) -> object:
    def attempt() -> str:
        calls.append(clock.now)
        if clock.now < seconds:
            raise Throttled()
        return "ok"

    return attempt


def _throttled(err: Exception) -> Transient | None:
    return Transient("HTTP 503 SlowDown", throttled=True) if isinstance(err, Throttled) else None


def test_the_default_policy_outlasts_30_s_of_throttling() -> None:
    for seed in range(20):  # the jitter's draws: any of them outlasts it
        rng = np.random.default_rng(seed)
        clock, calls = Clock(), []
        attempt = _server_throttling_for(clock, 30.0, calls)
        found = retrying(
            RetryPolicy(),
            attempt,  # type: ignore[arg-type]
            _throttled,
            what="s3://b/k: bytes 0..9",
            clock=clock,
            sleep=clock.sleep,
            draw=rng.random,
        )
        assert found == "ok"
        assert calls[-1] >= 30.0
        assert all(w <= RetryPolicy().max_backoff_s for w in clock.waits)
        assert len(calls) < 40  # backed off, not hammering


def test_the_final_error_says_how_long_and_how_many() -> None:
    clock, calls = Clock(), []
    attempt = _server_throttling_for(clock, 1e9, calls)
    with pytest.raises(RetriesExhaustedError) as err:
        retrying(
            RetryPolicy(retry_timeout_s=45.0),
            attempt,  # type: ignore[arg-type]
            _throttled,
            what="s3://b/k: bytes 0..9",
            clock=clock,
            sleep=clock.sleep,
            draw=lambda: 0.999,
        )
    # the last wait is cut so that one attempt lands on the deadline
    assert calls[-1] == pytest.approx(45.0)
    assert err.value.attempts == len(calls)
    assert err.value.elapsed_s == pytest.approx(45.0)
    message = str(err.value)
    assert message.startswith(f"s3://b/k: bytes 0..9: gave up after {len(calls)} attempts over")
    assert "45.0 s" in message
    assert "retry_timeout_s=45" in message
    assert message.endswith("last cause: HTTP 503 SlowDown")


def test_waits_are_full_jitter_growing_to_the_cap() -> None:
    policy = RetryPolicy(backoff_s=0.05, throttle_backoff_s=1.0, max_backoff_s=20.0)
    throttle, reset = Transient("503", throttled=True), Transient("reset")
    assert [policy.wait_s(n, throttle, 1.0) for n in range(7)] == [1, 2, 4, 8, 16, 20, 20]
    assert [policy.wait_s(n, reset, 1.0) for n in range(3)] == [0.05, 0.1, 0.2]
    assert policy.wait_s(4, throttle, 0.0) == 0.0  # full jitter: from zero
    assert policy.wait_s(100, throttle, 0.5) == 10.0  # no overflow far out


def test_retry_after_is_honoured_and_one_past_the_deadline_gives_up() -> None:
    clock, calls = Clock(), []

    def attempt() -> str:
        calls.append(clock.now)
        if len(calls) < 3:
            raise Throttled()
        return "ok"

    def classify(err: Exception) -> Transient:
        return Transient("HTTP 429", throttled=True, retry_after_s=7.0)

    policy = RetryPolicy(retry_timeout_s=60.0)
    found = retrying(policy, attempt, classify, what="x", clock=clock, sleep=clock.sleep)
    assert found == "ok"
    assert clock.waits == [7.0, 7.0]

    def later(err: Exception) -> Transient:
        return Transient("HTTP 503", throttled=True, retry_after_s=120.0)

    calls.clear()
    with pytest.raises(RetriesExhaustedError, match="the server asked to wait 120 s"):
        retrying(policy, lambda: attempt() and "", later, what="x", clock=clock, sleep=clock.sleep)


def test_max_attempts_caps_the_count_and_final_errors_are_not_retried() -> None:
    clock, calls = Clock(), []
    attempt = _server_throttling_for(clock, 1e9, calls)
    policy = RetryPolicy(max_attempts=3)
    with pytest.raises(RetriesExhaustedError, match="gave up after 3 attempts"):
        retrying(policy, attempt, _throttled, what="x", clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert len(calls) == 3

    def missing() -> str:
        calls.append(clock.now)
        raise PackNotFoundError("s3://b/k: no such object")

    calls.clear()
    with pytest.raises(PackNotFoundError):
        retrying(RetryPolicy(), missing, _throttled, what="x", clock=clock, sleep=clock.sleep)
    assert len(calls) == 1
    with pytest.raises(RetriesExhaustedError, match="gave up after 1 attempt over"):
        retrying(
            RetryPolicy(retry_timeout_s=0),
            _server_throttling_for(clock, 1e9, []),  # type: ignore[arg-type]
            _throttled,
            what="x",
            clock=clock,
            sleep=clock.sleep,
        )


def test_retry_after_headers() -> None:
    assert retry_after_s("12") == 12.0
    assert retry_after_s("  ", milliseconds="250") == 0.25
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
    assert retry_after_s("in a while") is None
    assert retry_after_s(None) is None


def test_the_policy_is_storage_options_under_the_names_users_know() -> None:
    options = s3.S3Options.of({"retry_timeout": "90", "retries": "7", "throttle_backoff_s": "2"})
    assert (options.retry_timeout_s, options.max_attempts, options.throttle_backoff_s) == (
        90.0,
        7,
        2.0,
    )
    assert s3.S3Options.of({"attempts": "3"}).max_attempts == 3
    assert s3.S3Options().retry_timeout_s >= 30
    assert s3.S3Options().max_attempts is None
    assert s3.S3Options.from_environment({"AWS_MAX_ATTEMPTS": "4"}) == {"max_attempts": "4"}
    with pytest.raises(OptionsError, match="retry_timeout_s should be >= 0"):
        s3.S3Options.of({"retry_timeout_s": "-1"})


def test_every_s3_request_kind_is_retried_by_time(s3_bucket: Bucket, tmp_path: Path) -> None:
    """HEAD, GET, PUT, multipart and lists each outlast throttling (simulated time).

    Six throttled answers in a row: more than a count of 5 tries allows, and at most 51 s
    of waits (1 + 2 + 4 + 8 + 16 + 20), within the default 60 s whatever the jitter draws.
    """
    clock = Clock()
    settings = {**s3_bucket.storage_options, "max_attempts": None, "throttle_backoff_s": 1.0}
    options = s3.S3Store.of(settings).options
    store = s3.S3Store(options, sleep=clock.sleep, clock=clock)
    local = tmp_path / "big.bin"
    local.write_bytes(np.random.default_rng(0).bytes(3 * 2**20 + 5))
    proxy = s3_bucket.proxy
    for method, times, action in [
        ("PUT", 6, lambda: store.put(s3_bucket.url("small"), b"x" * 10)),
        ("HEAD", 6, lambda: store.stat(s3_bucket.url("small"))),
        ("GET", 6, lambda: store.get(s3_bucket.url("small"))),
        (
            "PUT",
            6,
            lambda: store.publish(local, s3_bucket.url("big"), if_absent=False, part_size=2**20),
        ),
        ("GET", 6, lambda: store.pending(s3_bucket.url(""))),
        ("DELETE", 6, lambda: store.delete(s3_bucket.url("small"))),
    ]:
        proxy.reset_counts()
        proxy.inject(Fault("status", status=503, method=method), times=times)
        action()
        counts = proxy.reset_counts()
        assert counts.faults == times, method
        assert counts.requests[method] >= times + 1, method
    assert store.get(s3_bucket.url("big")) == local.read_bytes()
    assert clock.now > 0  # the throttling waits were taken (in simulated time)


def _epoch(loader: object) -> list[tuple[bytes, list[int], list[str]]]:
    return [
        (images.numpy().tobytes(), labels.tolist(), list(paths))
        for images, labels, paths in loader  # type: ignore[attr-defined]
    ]


@pytest.mark.slow
def test_a_10_s_slowdown_burst_ends_with_the_right_pixels(
    s3_bucket: Bucket, tmp_path: Path
) -> None:
    """Every request is answered 503 SlowDown for 10 s mid-epoch: the epoch completes."""
    from h5pack.read.options import ReaderOptions
    from h5pack.training.epochs import EpochSpec
    from h5pack.training.loader import make_loader
    from tests.helpers import make_pack

    local = make_pack(tmp_path / "a.h5", chunk_samples=2)
    url = s3_bucket.put(local, "a.h5")
    options = {**s3_bucket.storage_options, "max_attempts": None}
    options.update(backoff_s=0.05, throttle_backoff_s=1.0)  # the defaults
    reader = ReaderOptions(storage_options=options, disk_cache_dir=tmp_path / "cache")
    settings = {"num_workers": 0, "seed": 3, "return_path": True}
    batch = EpochSpec(batch_size=2, window_chunks=1)
    remote = make_loader(url, batch, reader=reader, **settings)  # type: ignore[arg-type]
    expected = _epoch(make_loader(local, batch, **settings))  # type: ignore[arg-type]
    proxy = s3_bucket.proxy
    over = threading.Event()

    def burst() -> None:
        proxy.inject(Fault("status", status=503, method=None), times=10**6)
        over.wait(10.0)  # the 10 s burst (a real one: the point of this test)
        proxy.clear()

    got, throttler = [], threading.Thread(target=burst)
    for number, item in enumerate(remote):
        got.append((item[0].numpy().tobytes(), item[1].tolist(), list(item[2])))
        if number == 0:
            proxy.reset_counts()
            throttler.start()
    over.set()
    throttler.join()
    counts = proxy.reset_counts()
    assert counts.faults >= 5  # the burst met the epoch, and was retried through
    assert counts.gets > counts.faults  # then served
    assert got == expected
