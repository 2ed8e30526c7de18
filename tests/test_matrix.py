"""Every drafter under every policy, through ``generate`` and through the server, on tiny native models: greedy
output is plain decoding's, seeded output is seeded plain decoding's, and both paths report the same statistics
(the same drafts proposed and accepted wherever the policy's choices do not follow measured time)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import asdict

import httpx
import pytest
import torch
from conftest import MODEL, TIMEOUT, Server, native_pipeline, random_draft_head, serving

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters import DRAFTERS
from quickdraft.engine import GenerationResult
from quickdraft.errors import ConfigError
from quickdraft.policies.acceptance_head import AcceptanceHead

POLICIES = ["goodput", "fixed:3", "heuristic", "confidence:0.4", "specdec++"]
TIMED = {"goodput"}  # choices that follow measured step times: the same tokens, not the same drafts
SAMPLINGS = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=0.8, top_p=0.95, seed=11)}
PROMPT = "w5 w9 w5 w9 w3 w1 w4 w1 w5 w9"
MAX_TOKENS = 14


def runs(drafter: str, policy: str) -> bool:
    """Whether a drafter runs under a policy: SpecDec++'s head judges drafts by the draft model's hidden states, and
    a drafter whose drafts carry none is refused with it (below)."""
    drafter_cls = DRAFTERS.get(drafter)
    return policy != "specdec++" or drafter_cls.drafts_hidden_states or not drafter_cls.proposes_drafts


COMBINATIONS = [pair for pair in itertools.product(DRAFTERS.names(), POLICIES) if runs(*pair)]
REFUSED = [pair for pair in itertools.product(DRAFTERS.names(), POLICIES) if not runs(*pair)]


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    """Tiny native models; every drafter has a made-up SpecDec++ head (a random head over the draft's hidden
    state: it changes how long blocks are, never the tokens)."""
    pipeline = native_pipeline()
    assert pipeline.draft is not None
    width = pipeline.draft.hidden_size + 2
    generator = torch.Generator().manual_seed(0)
    head = AcceptanceHead(
        torch.randn(width, generator=generator), torch.tensor(1.0), torch.zeros(width), torch.ones(width)
    )
    for name in DRAFTERS.names():
        pipeline.drafter_records(name).acceptance_head = head
    pipeline.draft_head = random_draft_head(pipeline.target, tmp_path_factory.mktemp("head") / "head.safetensors")
    return pipeline


@pytest.fixture(scope="module")
def server(native: Pipeline) -> Iterator[Server]:
    with serving(native) as running:
        yield running


@pytest.fixture(scope="module")
def generated(native: Pipeline) -> dict[tuple[str, str, str], GenerationResult]:
    """Every combination through ``Pipeline.generate``, one request at a time, plain decoding first."""
    prompt_ids = native.encode(PROMPT)
    results = {}
    for sampling_name, sampling in SAMPLINGS.items():
        for drafter, policy in [("none", "fixed:0"), *COMBINATIONS]:
            config = GenerationConfig(max_new_tokens=MAX_TOKENS, sampling=sampling, policy=policy)
            results[(drafter, policy, sampling_name)] = native.generate(prompt_ids, config, drafter)
    return results


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize(("drafter", "policy"), COMBINATIONS)
def test_generate_gives_plain_decodings_tokens(
    generated: dict[tuple[str, str, str], GenerationResult], drafter: str, policy: str, sampling: str
) -> None:
    plain = generated[("none", "fixed:0", sampling)]
    result = generated[(drafter, policy, sampling)]
    assert result.token_ids == plain.token_ids and result.text == plain.text
    assert set(result.stats.to_dict()) == set(plain.stats.to_dict())
    if drafter not in ("none",) and policy != "goodput":
        assert result.stats.draft_tokens_proposed > 0, "it speculated"


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize(("drafter", "policy"), COMBINATIONS)
def test_the_server_gives_what_generate_gives(
    server: Server,
    generated: dict[tuple[str, str, str], GenerationResult],
    drafter: str,
    policy: str,
    sampling: str,
) -> None:
    expected = generated[(drafter, policy, sampling)]
    params = asdict(SAMPLINGS[sampling])
    response = server.client().completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=params["temperature"],
        top_p=params["top_p"],
        seed=params["seed"],
        extra_body={"drafter": drafter, "policy": policy, "return_token_ids": True},
    )
    choice = response.choices[0]
    assert choice.token_ids == expected.token_ids and choice.text == expected.text  # type: ignore[attr-defined]
    speculation = response.model_extra["speculation"]  # type: ignore[index]
    assert set(speculation) == {"drafts_proposed", "drafts_accepted"}
    if policy not in TIMED and drafter != "early-exit":  # early exit's layer choice follows what it learned so far
        proposed, accepted = expected.stats.draft_tokens_proposed, expected.stats.draft_tokens_accepted
        assert (speculation["drafts_proposed"], speculation["drafts_accepted"]) == (proposed, accepted)


@pytest.mark.parametrize(("drafter", "policy"), REFUSED)
def test_a_drafter_a_policy_cannot_judge_is_refused_by_both(
    native: Pipeline, server: Server, drafter: str, policy: str
) -> None:
    config = GenerationConfig(max_new_tokens=MAX_TOKENS, policy=policy)
    with pytest.raises(ConfigError, match="judges drafts by the draft model's hidden states"):
        native.generate(PROMPT, config, drafter)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "drafter": drafter, "policy": policy}
    answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "drafter", answer.text
