"""The running requests' cache memory (``serve --kv-cache-mb``): what is available, the positions it buys, and a
server refusing a request that could never fit."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import MODEL, TIMEOUT, native_chat_pipeline, serving

from quickdraft.errors import ConfigError
from quickdraft.server import memory
from quickdraft.server.memory import MB, available_bytes, position_budget

GIB = 1024**3


def machine(root: Path, available_gib: int, cgroup: str = "", groups: dict[str, tuple[str, int, int]] | None = None,
            v1: bool = False) -> Path:  # fmt: skip
    """A /proc and /sys tree: MemAvailable, this process's cgroup line, and groups (path -> limit, usage, inactive
    file cache)."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {available_gib * 1024**2} kB\n")
    (root / "proc/self/cgroup").write_text(f"4:memory:{cgroup}\n0::/\n" if v1 else f"0::{cgroup}\n")
    base = root / "sys/fs/cgroup" / ("memory" if v1 else "")
    base.mkdir(parents=True)
    if not v1:
        (base / "cgroup.controllers").write_text("cpu memory\n")
    names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file") if v1 else (
        "memory.max", "memory.current", "inactive_file")  # fmt: skip
    for path, (limit, usage, inactive) in (groups or {}).items():
        group = base / path.lstrip("/")
        group.mkdir(parents=True, exist_ok=True)
        (group / names[0]).write_text(f"{limit}\n")
        (group / names[1]).write_text(f"{usage}\n")
        (group / "memory.stat").write_text(f"anon 1\n{names[2]} {inactive}\n")
    return root


def test_available_memory_is_the_systems_within_its_own_cgroups_limits(tmp_path: Path) -> None:
    assert available_bytes(machine(tmp_path / "plain", 48)) == 48 * GIB
    nested = {"/": ("max", 0, 0), "/slice": (str(8 * GIB), 4 * GIB, 0), "/slice/job": ("max", 4 * GIB, 0)}
    assert available_bytes(machine(tmp_path / "v2", 48, "/slice/job", nested)) == 4 * GIB  # the parent's limit
    cached = {"/job": (str(16 * GIB), 12 * GIB, 6 * GIB)}  # a file cache it can reclaim is free
    assert available_bytes(machine(tmp_path / "cache", 48, "/job", cached)) == 10 * GIB
    v1 = {"/": (str(2**63 - 4096), 5, 0), "/api/x": (str(8 * GIB), 2 * GIB, GIB)}
    assert available_bytes(machine(tmp_path / "v1", 48, "/api/x", v1, v1=True)) == 7 * GIB
    hidden = {"/": (str(8 * GIB), GIB, 0)}  # its own path not visible here (a namespace): the hierarchy's root
    assert available_bytes(machine(tmp_path / "namespace", 48, "/elsewhere", hidden)) == 7 * GIB
    assert available_bytes(tmp_path / "nothing") is None


def test_the_budget_in_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert position_budget(0, 1024, 0)[0] is None  # 0: no bound
    assert position_budget(None, 0, 0)[0] is None  # a runtime that does not say what a position costs
    assert position_budget(100, 1024, 512) == (100 * 1024, "request caches: up to 100 MB (--kv-cache-mb), "
                                                          "102,400 positions at 1 KiB each")  # fmt: skip
    monkeypatch.setattr(memory, "available_bytes", lambda: 8000 * MB)
    positions, note = position_budget(None, MB, 1000, share=0.5)  # 3/4 of 8000 / 2 - 1000 MB (its own prefixes)
    assert positions == 2000 and "75% of the 8000 MB available, 0.5 of it" in note
    with pytest.raises(ConfigError, match="lower --prefix-cache-mb"):
        position_budget(None, MB, 6000)
    assert position_budget(None, MB, 0, on_host=False) == (None, "request caches: no bound (they are the GPU's: give "
                                                                  "--kv-cache-mb)")  # fmt: skip
    assert position_budget(10, MB, 0, on_host=False)[0] == 10
    assert "more than the 8000 MB available" in position_budget(9000, MB, 0)[1]  # allowed, but said
    assert "with --prefix-cache-mb, more than the 8000 MB" in position_budget(7500, MB, 1000)[1]
    assert "more than the 4000 MB available to each replica" in position_budget(5000, MB, 0, share=0.5)[1]
    assert "available" not in position_budget(3000, MB, 0, share=0.5)[1]
    assert "available" not in position_budget(9000, MB, 0, on_host=False)[1]  # a GPU's memory is not read here
    with pytest.raises(ConfigError, match="--kv-cache-mb 1 holds no cache position"):
        position_budget(1, 2 * MB, 0)
    monkeypatch.setattr(memory, "available_bytes", lambda: None)
    assert position_budget(None, MB, 0)[0] is None


def test_a_request_that_could_never_fit_is_a_400_and_others_are_served() -> None:
    with serving(native_chat_pipeline(), max_positions=64) as running:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 100}
        refused = httpx.post(f"{running.url}/v1/chat/completions", json=body, timeout=TIMEOUT)
        assert refused.status_code == 400 and "this server's caches hold 64 tokens for all its" in refused.text
        assert refused.json()["error"]["param"] == "messages"
        unbounded = body | {"max_tokens": None, "messages": [{"role": "user", "content": " ".join(["w1"] * 40)}]}
        cut = httpx.post(f"{running.url}/v1/chat/completions", json=unbounded, timeout=TIMEOUT).json()
        assert cut["usage"]["total_tokens"] <= 64  # the default max_tokens is cut to what the caches leave
        too_long = httpx.post(f"{running.url}/v1/responses", json={"input": " ".join(["w1"] * 70)}, timeout=TIMEOUT)
        assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "input"
        served = httpx.post(f"{running.url}/v1/chat/completions", json=body | {"max_tokens": 8}, timeout=TIMEOUT)
        assert served.status_code == 200
