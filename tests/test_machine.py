"""h5pack.core.machine: the one place machine facts are read, containers included."""

from __future__ import annotations

from pathlib import Path

import pytest

from h5pack.core import machine


def _fake_cgroup(root: Path, limit: str, current: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "memory.max").write_text(f"{limit}\n")
    (root / "memory.current").write_text(f"{current}\n")


def test_a_container_limit_caps_total_and_available_memory(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(machine, "CGROUP_ROOT", tmp_path)
    own = Path("/proc/self/cgroup").read_text().splitlines()[-1].split(":", 2)[2]
    group = tmp_path / own.lstrip("/")  # the process's own group, as the kernel names it
    _fake_cgroup(group, str(3 * 2**20), 2**20)
    assert machine.memory_bytes() == 3 * 2**20
    assert machine.available_memory_bytes() == 2 * 2**20  # the limit less the group's use
    _fake_cgroup(group, "max", 2**20)  # no limit: the machine's own figures
    total = machine.memory_bytes()
    assert total is not None
    assert total > 3 * 2**20
    available = machine.available_memory_bytes()
    assert available is not None
    assert 0 < available <= total


def test_every_layer_reads_the_same_probe(monkeypatch) -> None:
    from h5pack.bench import system
    from h5pack.training import cache, epochs

    assert epochs.memory_bytes is machine.memory_bytes
    assert system.memory_bytes is machine.memory_bytes
    monkeypatch.setattr(cache, "available_memory_bytes", lambda: 4000)
    assert cache.default_cache_bytes(fraction=0.5) == 2000
    monkeypatch.setattr(cache, "available_memory_bytes", lambda: None)
    with pytest.raises(Exception, match="available memory is unknown"):
        cache.default_cache_bytes()
