"""The server with a draft model of another vocabulary: its answers are plain decoding's, greedy and seeded."""

from __future__ import annotations

from conftest import MODEL, foreign_pipeline, serving

PROMPT = "w1 w5 w9 w5 w9 w3 w7 w2"


def test_a_foreign_draft_serves_the_targets_own_answers() -> None:
    _, pipeline = foreign_pipeline()
    with serving(pipeline) as server:
        client = server.client()
        for sampling in ({"temperature": 0}, {"temperature": 0.8, "seed": 5}):
            texts = {
                drafter: client.completions.create(
                    model=MODEL, prompt=PROMPT, max_tokens=24, extra_body={"drafter": drafter}, **sampling
                )
                .choices[0]
                .text
                for drafter in ("none", "draft-model", "hybrid-suffix")
            }
            assert len(set(texts.values())) == 1, texts
