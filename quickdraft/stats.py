"""Statistics of one generation: what speculation proposed, what it got, where time went."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenerationStats:
    new_tokens: int = 0
    target_forwards: int = 0  # the prefill included
    draft_tokens_proposed: int = 0
    draft_tokens_accepted: int = 0
    predicted_tokens_accepted: int = 0  # accepted drafts copied from the request's predicted output
    cached_prompt_tokens: int = 0  # prompt tokens a cached prefix held, not read (prefix caching)
    wall_time_s: float = 0.0
    prefill_s: float = 0.0  # the target reading the prompt (a draft model reads it within draft_s)
    draft_s: float = 0.0
    verify_s: float = 0.0  # target forwards over drafts and the acceptance rule
    # One entry per target forward that committed tokens, the prefill's first token included:
    step_sizes: list[int] = field(default_factory=list)  # tokens committed by the step (accepted drafts + 1)
    step_times_s: list[float] = field(default_factory=list)  # seconds from the start to the step's commit
    gamma_per_step: list[int] = field(default_factory=list)  # γ the policy chose for each verify step
    proposed_per_step: list[int] = field(default_factory=list)  # drafts proposed (<= γ, or a lone judged reach)

    @property
    def acceptance_rate(self) -> float | None:
        """α = accepted / proposed; None when nothing was proposed."""
        return self.draft_tokens_accepted / self.draft_tokens_proposed if self.draft_tokens_proposed else None

    @property
    def mean_accepted_tokens(self) -> float | None:
        """τ = new tokens per target forward, the target's own token included."""
        return self.new_tokens / self.target_forwards if self.target_forwards else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else None

    @property
    def other_s(self) -> float:
        return max(0.0, self.wall_time_s - self.prefill_s - self.draft_s - self.verify_s)

    def to_dict(self) -> dict[str, Any]:
        """The scalar statistics (the per-step lists stay out of JSON output)."""
        return {
            "new_tokens": self.new_tokens,
            "target_forwards": self.target_forwards,
            "draft_tokens_proposed": self.draft_tokens_proposed,
            "draft_tokens_accepted": self.draft_tokens_accepted,
            "predicted_tokens_accepted": self.predicted_tokens_accepted,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_tokens": self.mean_accepted_tokens,
            "wall_time_s": self.wall_time_s,
            "tokens_per_s": self.tokens_per_s,
            "prefill_s": self.prefill_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "other_s": self.other_s,
        }

    def summary(self) -> str:
        alpha = "n/a" if self.acceptance_rate is None else f"{self.acceptance_rate:.2f}"
        tau = self.mean_accepted_tokens or 0.0
        return (
            f"{self.new_tokens} tokens in {self.wall_time_s:.2f} s ({self.tokens_per_s or 0:.2f} tok/s) | "
            f"target forwards {self.target_forwards}, τ {tau:.2f} tokens/forward | "
            f"drafts accepted {self.draft_tokens_accepted}/{self.draft_tokens_proposed} (α {alpha}) | "
            f"prefill {self.prefill_s:.2f} s, draft {self.draft_s:.2f} s, verify {self.verify_s:.2f} s, "
            f"other {self.other_s:.2f} s"
        )
