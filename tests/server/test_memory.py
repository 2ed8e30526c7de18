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


def machine(root: Path, available_kb: int, cgroup: tuple[str, str] | None = None, v1: bool = False) -> Path:
    (root / "proc").mkdir(parents=True)
    (root / "proc/meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {available_kb} kB\nCached: 1 kB\n")
    if cgroup is not None:
        folder = root / "sys/fs/cgroup" / ("memory" if v1 else "")
        folder.mkdir(parents=True)
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes") if v1 else ("memory.max", "memory.current")
        for name, value in zip(names, cgroup, strict=True):
            (folder / name).write_text(value + "\n")
    return root


def test_available_memory_is_the_systems_within_its_cgroups_limit(tmp_path: Path) -> None:
    assert available_bytes(machine(tmp_path / "plain", 8 * 1024**2)) == 8 * 1024**3
    assert available_bytes(machine(tmp_path / "v2", 8 * 1024**2, (str(3 * 1024**3), str(1024**3)))) == 2 * 1024**3
    assert available_bytes(machine(tmp_path / "none", 8 * 1024**2, ("max", "5"))) == 8 * 1024**3
    assert available_bytes(machine(tmp_path / "v1", 8 * 1024**2, (str(2**63 - 4096), "5"), v1=True)) == 8 * 1024**3
    assert available_bytes(tmp_path / "nothing") is None


def test_the_budget_in_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert position_budget(0, 1024, 0)[0] is None  # 0: no bound
    assert position_budget(None, 0, 0)[0] is None  # a runtime that does not say what a position costs
    assert position_budget(100, 1024, 512) == (100 * 1024, "request caches: up to 100 MB (--kv-cache-mb), "
                                                          "102,400 positions at 1 KiB each")  # fmt: skip
    monkeypatch.setattr(memory, "available_bytes", lambda: 8000 * MB)
    positions, note = position_budget(None, MB, 1000, share=0.5)  # (3/4 of 8000 - 1000) / 2 MB
    assert positions == 2500 and "75% of the 8000 MB available, 0.5 of it" in note
    with pytest.raises(ConfigError, match="lower --prefix-cache-mb"):
        position_budget(None, MB, 6000)
    monkeypatch.setattr(memory, "available_bytes", lambda: None)
    assert position_budget(None, MB, 0)[0] is None


def test_a_request_that_could_never_fit_is_a_400_and_others_are_served() -> None:
    with serving(native_chat_pipeline(), max_positions=64) as running:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 100}
        refused = httpx.post(f"{running.url}/v1/chat/completions", json=body, timeout=TIMEOUT)
        assert refused.status_code == 400 and "more than the 64 this server's caches hold" in refused.text
        served = httpx.post(f"{running.url}/v1/chat/completions", json=body | {"max_tokens": 8}, timeout=TIMEOUT)
        assert served.status_code == 200
