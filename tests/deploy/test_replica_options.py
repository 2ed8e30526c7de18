"""``serve --replicas``: bad options and a missing Ray are clear errors, before any model is loaded."""

from __future__ import annotations

import sys

import pytest

from quickdraft.cli import main


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--max-replicas", "2"], "--replicas must be >= 1"),
        (["--replicas", "3", "--max-replicas", "2"], "--max-replicas (2) must be >= --replicas (3)"),
        (["--replicas", "2", "--threads-per-replica", "-1"], "--threads-per-replica must be >= 1"),
    ],
)
def test_bad_replica_options_are_clear_errors(args: list[str], words: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", *args]) == 1
    assert words in capsys.readouterr().err


def test_replicas_without_ray_say_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if it were not installed
    monkeypatch.delitem(sys.modules, "quickdraft.deploy.ray_serve", raising=False)
    assert main(["serve", "--replicas", "2"]) == 1
    assert "pip install 'quickdraft[ray]'" in capsys.readouterr().err
