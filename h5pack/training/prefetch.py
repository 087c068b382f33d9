"""``DevicePrefetcher``: batches already on the GPU, one ahead, normalised there; echoing."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from h5pack.core.arguments import check_int
from h5pack.errors import OptionsError
from h5pack.training.stats import STAGES, LoaderStats, StageNs, StallMonitor, stage_times


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, tuple | list):
        return type(value)(_to_device(v, device) for v in value)
    return value


class StallReports:
    """``stats``, ``reset_stats`` and ``report_every`` of the ``StallMonitor`` at ``stall``."""

    stall: StallMonitor

    def _settle(self) -> None:
        """Bring stage times still pending into ``stall``."""

    def stats(self) -> LoaderStats:
        """Return how long training waited for batches and which stage is why (``LoaderStats``)."""
        self._settle()
        return self.stall.stats()

    def reset_stats(self) -> None:
        """Start ``stats()`` again from zero (e.g. after a warm-up epoch)."""
        self._settle()
        self.stall.reset()

    def report_every(
        self, steps: int, log: Callable[[str], None] | None = None, *, full: bool = False
    ) -> None:
        """Log ``stats()`` every ``steps`` batches (``StallMonitor.report_every``)."""
        self.stall.report_every(steps, log, full=full)


class DevicePrefetcher(StallReports):
    """Iterate a loader with each batch already on ``device``, one batch ahead; echo batches.

    On CUDA the next batch is copied on a side stream (from pinned memory) while the current
    one is used. With ``echo=k`` every batch is yielded k times in a row (Choi et al., "Data
    Echoing", 2019): augment on the device after this so that the repeats differ.

    Args:
        loader: Any iterable of batches (``make_loader``'s ``H5Loader`` included).
        device: Target device; default CUDA when available, else CPU.
        echo: Times each batch is yielded.
        normalize: Per-channel ``(mean, std)`` on the 0..1 scale: the images (first tensor)
            become float32 ``(x / 255 - mean) / std`` on the device; None: uint8.

    Example:
        >>> batches = [(torch.zeros(2), torch.ones(2))]
        >>> [b[1].tolist() for b in DevicePrefetcher(batches, "cpu", echo=2)]
        [[1.0, 1.0], [1.0, 1.0]]
    """

    def __init__(
        self,
        loader: Any,
        device: str | torch.device | None = None,
        *,
        echo: int = 1,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
    ) -> None:
        self.echo = check_int("echo", echo, minimum=1)
        self.loader = loader
        inner = getattr(loader, "stall", None)
        self.stall = StallMonitor(
            parallel=getattr(inner, "parallel", 1), facts=getattr(inner, "facts", None)
        )
        self._events: list[tuple[Any, Any]] = []  # CUDA copies not yet added to "transfer"
        default = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(default if device is None else device)
        self._scale: tuple[torch.Tensor, torch.Tensor] | None = None
        if normalize is not None:
            mean, std = (torch.tensor(v, dtype=torch.float32) for v in normalize)
            if mean.shape != std.shape or mean.ndim != 1 or bool((std <= 0).any()):
                raise OptionsError(
                    "normalize should be (mean, std), one positive std per channel, but got "
                    f"normalize={normalize!r}"
                )
            # (x / 255 - mean) / std == x * (1 / (255 std)) - mean / std
            multiplier = (1.0 / (255.0 * std)).view(1, -1, 1, 1).to(self.device)
            offset = (mean / std).view(1, -1, 1, 1).to(self.device)
            self._scale = (multiplier, offset)

    def _move(self, batch: Any) -> Any:
        moved = _to_device(batch, self.device)
        if self._scale is None:
            return moved
        multiplier, offset = self._scale
        first = moved[0] if isinstance(moved, tuple | list) else moved
        images = first.float().mul_(multiplier).sub_(offset)
        if isinstance(moved, tuple | list):
            return type(moved)([images, *moved[1:]])
        return images

    def __len__(self) -> int:
        return len(self.loader) * self.echo

    def _settle(self) -> None:
        """Add the finished CUDA copies' times to "transfer" (an event query, no sync)."""
        pending = []
        for start, end in self._events:
            if end.query():
                ns = int(start.elapsed_time(end) * 1e6)  # milliseconds
                self.stall.stage_ns[STAGES.index("transfer")] += ns
            else:
                pending.append((start, end))
        self._events = pending

    def _stage_ns(self) -> Any:
        """The stage times of the loader's last batch (an H5Loader's), or None."""
        inner = getattr(self.loader, "stall", None)
        taken = getattr(inner, "last_stage_ns", None)
        return None if taken is None else taken.copy()

    def set_epoch(self, epoch: int) -> None:
        """Forward to the loader's ``set_epoch``."""
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.stall.timed(self._batches()):
            for _ in range(self.echo):
                yield batch

    def _batches(self) -> Iterator[Any]:
        """Batches on the device, each with the stage times behind it."""
        clock = stage_times().clock
        if self.device.type != "cuda":
            for batch in self.loader:
                stages = self._stage_ns()
                start = clock()
                moved = self._move(batch)
                if stages is not None:
                    stages[STAGES.index("transfer")] += clock() - start
                yield (moved, StageNs(stages)) if stages is not None else moved
            return
        stream = torch.cuda.Stream(self.device)
        iterator = iter(self.loader)

        def fetch() -> Any:
            try:
                batch = next(iterator)
            except StopIteration:
                return None
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            with torch.cuda.stream(stream):
                start.record(stream)
                moved = self._move(batch)
                end.record(stream)
            self._events.append((start, end))
            if len(self._events) > 64:
                self._settle()
            return moved, self._stage_ns()

        upcoming = fetch()
        while upcoming is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            current, stages = upcoming
            for tensor in _tensors(current):
                tensor.record_stream(torch.cuda.current_stream(self.device))
            upcoming = fetch()
            yield (current, StageNs(stages)) if stages is not None else current


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _tensors(v)
