"""``--target hf:OWNER/REPO/FILE.gguf``: a GGUF file downloaded from a hub once, resumed after an interruption.
The hub is a loopback server speaking the Hugging Face resolve protocol (HEAD for the metadata, GET with Range for
the bytes), reached through ``$HF_ENDPOINT`` in a separate process, as a user's environment would set it."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import write_tiny_gguf

from quickdraft.errors import ModelFilesError
from quickdraft.models.loading import download_bar, download_gguf

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub(http.server.ThreadingHTTPServer):
    """Serves ``files`` (path in the repository -> bytes) of one repository; the first GET stops after
    ``interrupt_at`` bytes when that is set. ``ranges`` records the Range header of every GET."""

    def __init__(self, repo: str, files: dict[str, bytes], interrupt_at: int | None = None) -> None:
        super().__init__(("127.0.0.1", 0), HubHandler)
        self.repo, self.files, self.interrupt_at = repo, files, interrupt_at
        self.ranges: list[str | None] = []
        self.claims_other_bytes = False  # its ETag names other bytes than it sends: a corrupt download


class HubHandler(http.server.BaseHTTPRequestHandler):
    server: Hub

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def found(self) -> bytes | None:
        prefix = f"/{self.server.repo}/resolve/main/"
        name = self.path[len(prefix) :] if self.path.startswith(prefix) else None
        return self.server.files.get(name) if name is not None else None

    def head_for(self, data: bytes, status: int = 200, start: int = 0) -> None:
        self.send_response(status)
        self.send_header("X-Repo-Commit", COMMIT)
        claimed = data[::-1] if self.server.claims_other_bytes else data
        self.send_header("ETag", f'"{hashlib.sha256(claimed).hexdigest()}"')
        self.send_header("Content-Length", str(len(data) - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()

    def do_HEAD(self) -> None:
        data = self.found()
        if data is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.end_headers()
            return
        self.head_for(data)

    def do_GET(self) -> None:
        data = self.found()
        if data is None:
            self.send_error(404)
            return
        requested = self.headers.get("Range")
        self.server.ranges.append(requested)
        start = int(requested.split("=")[1].split("-")[0]) if requested else 0
        self.head_for(data, 206 if start else 200, start)
        if self.server.interrupt_at is not None and len(self.server.ranges) == 1:
            self.wfile.write(data[: self.server.interrupt_at])  # then the connection drops
            self.close_connection = True
            return
        self.wfile.write(data[start:])


CHUNK = 10 * 1024 * 1024  # huggingface_hub writes what it receives in chunks of 10 MiB
BIG = "big/weights.gguf"  # 24 MiB that are not a model: only downloaded


@contextlib.contextmanager
def serving(files: dict[str, bytes], interrupt_at: int | None = None) -> Iterator[Hub]:
    server = Hub("someone/tiny-GGUF", files, interrupt_at)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    with serving({"quant/tiny-Q8_0.gguf": write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()}) as server:
        yield server


def resolve_in_a_process(
    spec: str, hub: Hub, cache: Path, call: str = "resolve_model", progress: bool = False
) -> subprocess.CompletedProcess[str]:
    """``resolve_model(spec)`` (or ``download_gguf``) in a fresh process whose environment points at the hub and
    quiets huggingface_hub's bars as the CLI does."""
    script = (
        "import json, sys\n"
        "from quickdraft.errors import QuickdraftError\n"
        f"from quickdraft.models.loading import {call}\n"
        "try:\n"
        f"    print(json.dumps(str({call}({spec!r}, progress={progress}))))\n"
        "except QuickdraftError as error:\n"
        "    sys.exit(str(error))\n"
    )
    environment = os.environ | {
        "HF_ENDPOINT": f"http://127.0.0.1:{hub.server_address[1]}",
        "QUICKDRAFT_CACHE": str(cache),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_ETAG_TIMEOUT": "5",
        "HF_HUB_DOWNLOAD_TIMEOUT": "5",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    return subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=120)


def test_a_gguf_file_on_the_hub_is_downloaded_once(hub: Hub, tmp_path: Path) -> None:
    spec = "hf:someone/tiny-GGUF/quant/tiny-Q8_0.gguf"
    first = resolve_in_a_process(spec, hub, tmp_path / "cache")
    assert first.returncode == 0, first.stderr
    directory = Path(json.loads(first.stdout))
    assert (directory / "config.json").is_file()
    second = resolve_in_a_process(spec, hub, tmp_path / "cache")
    assert second.returncode == 0 and json.loads(second.stdout) == str(directory)
    assert hub.ranges == [None]  # one download; the second run found it in the cache


@pytest.mark.parametrize("progress", [True, False])
def test_a_download_shows_its_bar_when_asked(progress: bool, hub: Hub, tmp_path: Path) -> None:
    """The bar is the caller's choice, not $HF_HUB_DISABLE_PROGRESS_BARS's (which the CLI sets for transformers'
    bars), and asking for it draws no warning from huggingface_hub."""
    done = resolve_in_a_process("hf:someone/tiny-GGUF/quant/tiny-Q8_0.gguf", hub, tmp_path, "download_gguf", progress)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr
    assert ("tiny-Q8_0.gguf" in done.stderr and "100%" in done.stderr) is progress


def test_a_hub_without_bars_of_anothers_draws_its_own() -> None:
    """huggingface_hub before 1.0 takes no ``tqdm_class``: nothing is passed, and its own bars follow ``progress``."""
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars

    def old_download(repo_id: str, filename: str, cache_dir: str | None = None) -> str:
        return ""

    def new_download(repo_id: str, filename: str, tqdm_class: object = None) -> str:
        return ""

    disabled_before = are_progress_bars_disabled()
    assert download_bar(old_download, progress=False) == {} and are_progress_bars_disabled()
    if not disabled_before:
        enable_progress_bars()
    assert callable(download_bar(new_download, progress=True)["tqdm_class"])


def test_an_interrupted_download_resumes_where_it_stopped(tmp_path: Path) -> None:
    data = os.urandom(24 * 1024 * 1024)
    with serving({BIG: data}, interrupt_at=CHUNK + 12345) as hub:  # drops after the first chunk was written
        done = resolve_in_a_process(f"hf:someone/tiny-GGUF/{BIG}", hub, tmp_path / "cache", "download_gguf")
    assert done.returncode == 0, done.stderr
    assert hub.ranges == [None, f"bytes={CHUNK}-"]  # the rest, not the whole file again
    assert Path(json.loads(done.stdout)).read_bytes() == data


def test_a_download_that_does_not_match_its_sha256_is_refused_and_removed(hub: Hub, tmp_path: Path) -> None:
    hub.claims_other_bytes = True
    corrupt = resolve_in_a_process("hf:someone/tiny-GGUF/quant/tiny-Q8_0.gguf", hub, tmp_path / "cache")
    assert corrupt.returncode != 0 and "does not match its sha256" in corrupt.stderr and "removed" in corrupt.stderr
    assert not [path for path in (tmp_path / "cache" / "hub").rglob("*") if path.is_file() and "blobs" in path.parts]
    hub.claims_other_bytes = False
    assert resolve_in_a_process("hf:someone/tiny-GGUF/quant/tiny-Q8_0.gguf", hub, tmp_path / "cache").returncode == 0


def test_a_missing_file_or_a_bad_name_is_a_clear_error(hub: Hub, tmp_path: Path) -> None:
    missing = resolve_in_a_process("hf:someone/tiny-GGUF/other.gguf", hub, tmp_path / "cache")
    assert "someone/tiny-GGUF on the hub has no file other.gguf" in missing.stderr
    for bad in ("hf:someone/tiny.gguf", "hf:someone/repo/weights.bin", "hf://a/b/c.gguf"):
        with pytest.raises(ModelFilesError, match=r"is not hf:OWNER/REPO/FILE\.gguf"):
            download_gguf(bad)
    for bad in ("hf:some one/tiny-GGUF/tiny.gguf", "hf:someone/tiny-GGUF/../../x.gguf"):
        invalid = resolve_in_a_process(bad, hub, tmp_path / "cache")
        assert invalid.returncode != 0 and "Traceback" not in invalid.stderr, invalid.stderr


def test_a_hub_that_cannot_be_reached_is_named_as_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, huggingface_hub raises LocalEntryNotFoundError (an EntryNotFoundError too): the hub could not be
    reached, not "the repository has no such file"."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(*args: object, **kwargs: object) -> None:
        try:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        except ConnectionRefusedError as refused:
            raise LocalEntryNotFoundError("cannot find the requested files in the local cache") from refused

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    monkeypatch.setattr("quickdraft.models.loading.unreachable", lambda url: None)  # the connection failed later
    with pytest.raises(ModelFilesError) as error:
        download_gguf("hf:nobody/norepo/x.gguf", progress=False)
    message = str(error.value)
    assert message.startswith("cannot download x.gguf from nobody/norepo: the hub at ")
    assert "could not be reached ([Errno 111] Connection refused)" in message and "has no file" not in message


def test_a_hub_gone_offline_gives_the_copy_downloaded_before_at_once(hub: Hub, tmp_path: Path) -> None:
    """huggingface_hub retries an unreachable hub five times (~25 s): a refused connection is seen first, and
    the copy in the cache is used, with a note; with no copy, the error names the cause."""
    spec = "hf:someone/tiny-GGUF/quant/tiny-Q8_0.gguf"
    first = resolve_in_a_process(spec, hub, tmp_path / "cache", "download_gguf")
    assert first.returncode == 0, first.stderr
    hub.shutdown()
    hub.server_close()  # the port now refuses connections
    again = resolve_in_a_process(spec, hub, tmp_path / "cache", "download_gguf")
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    assert "cannot be reached" in again.stderr and "as downloaded before" in again.stderr
    assert "Retry" not in again.stderr
    other = resolve_in_a_process("hf:someone/tiny-GGUF/other.gguf", hub, tmp_path / "cache", "download_gguf")
    assert other.returncode != 0 and "could not be reached" in other.stderr and "Retry" not in other.stderr
