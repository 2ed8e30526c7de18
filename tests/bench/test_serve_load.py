"""bench-serve's configurations and the one-line errors of a server it cannot use (no server is started)."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from quickdraft.bench.serve_load import ServedConfig, check_reachable, request_failure
from quickdraft.errors import ConfigError

MODELS = httpx.Request("GET", "http://127.0.0.1:8123/v1/models")


def test_drafter_and_policy_names_are_checked_when_parsed() -> None:
    assert ServedConfig.parse("fast=hybrid+fixed:3:cache") == ServedConfig(
        "fast", "hybrid", "fixed:3", prompt_cache=True
    )
    for text, message in [
        ("x=nodrafter", "configuration 'x=nodrafter': unknown drafter 'nodrafter'; choose one of: "),
        ("x=none+foo", "configuration 'x=none+foo': unknown speculation policy 'foo'"),
        ("x=hybrid+fixed:abc", "fixed:K must be an integer, got 'abc'"),
        ("x=hybrid+goodput:1", "the goodput policy takes no argument"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            ServedConfig.parse(text)


def test_a_failed_request_outside_the_records_is_one_line() -> None:
    refused = openai.APIConnectionError(request=MODELS)
    refused.__cause__ = httpx.ConnectError("[Errno 111] Connection refused")
    assert str(request_failure(refused)) == (
        "cannot reach the server at http://127.0.0.1:8123 ([Errno 111] Connection refused): is it running?"
    )
    assert "did not answer in time" in str(request_failure(openai.APITimeoutError(request=MODELS)))
    bad = openai.BadRequestError("unknown drafter 'x'", response=httpx.Response(400, request=MODELS), body=None)
    assert str(request_failure(bad)) == (
        "the server at http://127.0.0.1:8123 refused a request with status 400: unknown drafter 'x'"
    )
    assert "cannot reach the server at http://127.0.0.1:8123" in str(
        request_failure(httpx.ConnectError("", request=MODELS))
    )


def test_an_unreachable_url_fails_before_any_model_loads() -> None:
    with pytest.raises(ConfigError, match=r"^cannot reach the server at http://127\.0\.0\.1:1 \("):
        check_reachable("http://127.0.0.1:1")
