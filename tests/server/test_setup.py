"""``server/setup.py``: what a server refuses before it serves."""

from __future__ import annotations

import pytest
from conftest import native_chat_pipeline

from quickdraft.errors import ConfigError


def test_more_drafts_than_goodput_can_measure_on_the_target_is_refused_naming_max_draft_tokens() -> None:
    """The server measures goodput's costs whatever its default policy (a request may ask for goodput): a
    ``--max-draft-tokens`` past what the target holds is its error, not ``--policy``'s."""
    from quickdraft.engine import SchedulerSettings
    from quickdraft.server.setup import serving_engine

    with pytest.raises(ConfigError, match=r"max_draft_tokens is at most 191 for this target") as error:
        serving_engine(native_chat_pipeline(), SchedulerSettings(4, 4, 16), max_draft_tokens=600)
    assert error.value.setting == "max_draft_tokens"
