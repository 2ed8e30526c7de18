"""``serve --replicas``: bad options and a missing Ray are clear errors, before any model is loaded."""

from __future__ import annotations

import socket
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


RAY_TRACEBACK = """A replica failed to start with exception. Retrying 1 more time(s). Error:
RuntimeError: Traceback (most recent call last):
  File "/x/ray/serve/_private/replica.py", line 1867, in initialize
    raise ModelFilesError(f"{path} is not a transformers model directory: it has no config.json")
quickdraft.errors.ModelFilesError: /m is not a transformers model directory: it has no config.json"""


class Status:
    """What ``serve.status()`` gives for quickdraft's application: its state and the replicas' message."""

    def __init__(self, status: str, message: str) -> None:
        from types import SimpleNamespace

        replicas = SimpleNamespace(message=message)
        self.applications = {
            "quickdraft": SimpleNamespace(status=status, message="", deployments={"QuickdraftReplica": replicas})
        }


def scripted(monkeypatch: pytest.MonkeyPatch, statuses: list[Status]) -> None:
    ray_serve = pytest.importorskip("quickdraft.deploy.ray_serve", reason="the ray extra is not installed")
    monkeypatch.setattr(ray_serve.serve, "status", lambda: statuses.pop(0) if len(statuses) > 1 else statuses[0])
    monkeypatch.setattr(ray_serve.time, "sleep", lambda _: None)
    monkeypatch.setattr(ray_serve, "WAIT_NOTE_S", 0.0)


def test_replicas_that_fail_to_start_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's message holds the replica's traceback; the error is its last exception, without the module."""
    from quickdraft.errors import ConfigError

    scripted(monkeypatch, [Status("DEPLOYING", ""), Status("DEPLOY_FAILED", RAY_TRACEBACK)])
    from quickdraft.deploy import ray_serve

    with pytest.raises(ConfigError) as raised:
        ray_serve.wait_running(lambda _: None)
    assert str(raised.value) == (
        "the replicas did not start: ModelFilesError: /m is not a transformers model directory: it has no config.json"
    )


def test_replicas_waiting_for_cpus_are_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    waiting = 'has 1 replicas that have taken more than 30s to be scheduled. Resources required: {"CPU": 4}'
    scripted(monkeypatch, [Status("DEPLOYING", waiting), Status("DEPLOYING", waiting), Status("RUNNING", "")])
    from quickdraft.deploy import ray_serve

    notes: list[str] = []
    ray_serve.wait_running(notes.append)
    assert notes and all(waiting in note for note in notes)


def test_a_clusters_serve_on_another_port_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray keeps the port its Serve started with and only warns: the endpoint would not be where it was asked."""
    from types import SimpleNamespace

    from quickdraft.errors import ConfigError

    ray_serve = pytest.importorskip("quickdraft.deploy.ray_serve", reason="the ray extra is not installed")
    client = SimpleNamespace(http_config=SimpleNamespace(host="127.0.0.1", port=8000))
    monkeypatch.setattr("ray.serve.context._get_global_client", lambda: client)
    ray_serve.check_http(ray_serve.DeploymentOptions(2, 1, "127.0.0.1", 8000))  # as asked: fine
    with pytest.raises(ConfigError, match=r"already listens on 127\.0\.0\.1:8000.*--port 8000"):
        ray_serve.check_http(ray_serve.DeploymentOptions(2, 1, "127.0.0.1", 9000))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--threads-per-replica", "0"], "--replicas must be >= 1"),  # it was taken for no replica option at all
        (["--max-replicas", "0"], "--replicas must be >= 1"),  # so was this, and an empty address
        (["--ray-address", ""], "--replicas must be >= 1"),
        (["--replicas", "2", "--threads-per-replica", "0"], "--threads-per-replica must be >= 1, got 0"),
    ],
)
def test_zero_threads_per_replica_is_an_error_not_the_default(
    args: list[str], words: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(["serve", *args]) == 1
    assert words in capsys.readouterr().err


def test_replicas_on_a_port_in_use_are_refused_before_ray_starts(capsys: pytest.CaptureFixture) -> None:
    ray_serve = pytest.importorskip("quickdraft.deploy.ray_serve", reason="the ray extra is not installed")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--replicas", "1", "--threads-per-replica", "1", "--port", str(port)]) == 1
        local = ["--ray-address", " local "]  # Ray's name for a Ray of this process's own, spaces as Ray takes them
        assert main(["serve", "--replicas", "1", "--threads-per-replica", "1", "--port", str(port), *local]) == 1
    err = capsys.readouterr().err
    assert err.count(f"cannot serve on 127.0.0.1:{port}: Address already in use") == 2
    assert not ray_serve.ray.is_initialized()


def test_a_ray_address_that_is_none_or_unreachable_is_a_clear_error(capsys: pytest.CaptureFixture) -> None:
    ray_serve = pytest.importorskip("quickdraft.deploy.ray_serve", reason="the ray extra is not installed")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert main(["serve", "--replicas", "1", "--threads-per-replica", "1", "--ray-address", "bogus"]) == 1
    assert "a Ray cluster's address is host:port" in (err := capsys.readouterr().err) and "(--ray-address)" in err
    assert main(["serve", "--replicas", "1", "--threads-per-replica", "1", "--ray-address", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}: Connection refused (--ray-address)" in err
    assert "Traceback" not in err and not ray_serve.ray.is_initialized()


def test_rays_own_refusal_to_join_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` with no cluster running, or Ray Client's timeout: Ray raises ConnectionError."""
    pytest.importorskip("quickdraft.deploy.ray_serve", reason="the ray extra is not installed")
    from quickdraft.deploy import ray_cluster
    from quickdraft.errors import ConfigError

    def no_cluster(**_: object) -> None:
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray_cluster.ray, "init", no_cluster)
    with pytest.raises(ConfigError, match="cannot join a Ray cluster at 'auto': Could not find") as raised:
        ray_cluster.join("auto")
    assert raised.value.setting == "ray_address"


def test_a_ray_address_whose_lookup_hangs_is_a_clear_error_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host name lookup has no timeout of its own: it is bounded by the address's reach timeout."""
    pytest.importorskip("quickdraft.deploy.ray_serve", reason="the ray extra is not installed")
    import threading
    import time

    from quickdraft.deploy import ray_cluster
    from quickdraft.errors import ConfigError

    released = threading.Event()

    def hanging(*_: object, **__: object) -> list[object]:
        released.wait(10)
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(ray_cluster.socket, "getaddrinfo", hanging)
    monkeypatch.setattr(ray_cluster, "REACH_TIMEOUT_S", 0.2)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="cannot reach a Ray cluster at head:6379: looking up 'head' took more"):
        ray_cluster.check_reachable("head:6379")
    assert time.monotonic() - started < 5
    released.set()
    with pytest.raises(ConfigError, match="at head:6379: Name or service not known"):
        ray_cluster.check_reachable("head:6379")


def test_a_ray_address_is_reached_at_any_of_its_hosts_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    """``localhost`` may be ::1 first where Ray listens on 127.0.0.1: each address is tried, as a connection would."""
    pytest.importorskip("quickdraft.deploy.ray_serve", reason="the ray extra is not installed")
    from quickdraft.deploy import ray_cluster

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        found = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
                 (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]  # fmt: skip
        monkeypatch.setattr(ray_cluster.socket, "getaddrinfo", lambda *_, **__: found)
        ray_cluster.check_reachable(f"head:{port}")  # ::1 refuses (nothing listens there), 127.0.0.1 accepts
