"""``server/setup.py``: what a server refuses before it serves."""

from __future__ import annotations

import pytest
from conftest import native_chat_pipeline, native_from_hf, noisy_copy, tiny_model, word_tokenizer

from quickdraft.api import Pipeline
from quickdraft.errors import ConfigError


def test_more_drafts_than_goodput_can_measure_on_the_target_is_refused_naming_max_draft_tokens() -> None:
    """The server measures goodput's costs whatever its default policy (a request may ask for goodput): a
    ``--max-draft-tokens`` past what the target holds is its error, not ``--policy``'s."""
    from quickdraft.engine import SchedulerSettings
    from quickdraft.server.setup import serving_engine

    with pytest.raises(ConfigError, match=r"max_draft_tokens is at most 191 for this target") as error:
        serving_engine(native_chat_pipeline(), SchedulerSettings(4, 4, 16), max_draft_tokens=600)
    assert error.value.setting == "max_draft_tokens"


def test_a_capped_context_serves_what_fits_and_names_the_cap_where_nothing_does() -> None:
    """A cap of a few positions (``max_context``) below goodput's timed step is refused naming it; above, the batch
    costs are timed in rows that fit it, whatever ``--max-running`` and ``--prefill-tokens-per-step`` add up to."""
    from quickdraft.engine import SchedulerSettings
    from quickdraft.server.setup import serving_engine

    def capped(positions: int) -> Pipeline:
        target, draft = (native_from_hf(model, capacity=positions) for model in (tiny_model(48, 0), noisy_copy(48)))
        return Pipeline(target=target, tokenizer=word_tokenizer(48), eos_token_ids=frozenset(), draft=draft)

    with pytest.raises(ConfigError, match=r"this target is too short: .* a server needs 66 at least") as error:
        serving_engine(capped(65), SchedulerSettings(1, 4, 128), max_draft_tokens=1)
    assert error.value.setting == "max_context"
    engine, _ = serving_engine(capped(100), SchedulerSettings(1, 4, 128), max_draft_tokens=8)
    assert max(engine.batch_costs.target_ms) <= 100 - 8  # a row of 129 tokens after 8 cached was a traceback
