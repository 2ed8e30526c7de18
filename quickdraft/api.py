"""The library entry point: load a target (and a draft) once, generate with any drafter."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quickdraft.config import GenerationConfig
from quickdraft.drafters import DRAFTERS, DrafterOptions
from quickdraft.engine import GenerationResult, GenerationStream, SpeculativeEngine
from quickdraft.errors import ConfigError, PromptError
from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, check_same_tokenizer, load_tokenizer, resolve_model
from quickdraft.runtime import RUNTIMES, Runtime


@dataclass
class Pipeline:
    """Loaded models plus a tokenizer. ``generate``/``stream`` take the drafter by name."""

    target: Runtime
    tokenizer: Any
    eos_token_ids: frozenset[int]
    target_path: Path | None = None
    draft: Runtime | None = None
    draft_path: Path | None = None

    @classmethod
    def load(
        cls,
        target: str | Path = DEFAULT_TARGET,
        draft: str | Path | None = DEFAULT_DRAFT,
        runtime: str = "transformers",
        progress: bool = True,
    ) -> Pipeline:
        """Resolve and load models: packaged names, transformers directories or GGUF files.

        ``draft=None`` loads no draft model (enough for prompt lookup and plain decoding).
        """
        runtime_cls = RUNTIMES.get(runtime)
        target_path = resolve_model(target, progress)
        tokenizer = load_tokenizer(target_path)
        draft_path = draft_runtime = None
        if draft is not None:
            draft_path = resolve_model(draft, progress)
            check_same_tokenizer(tokenizer, load_tokenizer(draft_path))
            draft_runtime = runtime_cls.load(draft_path)
        return cls(
            target=runtime_cls.load(target_path),
            tokenizer=tokenizer,
            eos_token_ids=eos_token_ids(target_path, tokenizer),
            target_path=target_path,
            draft=draft_runtime,
            draft_path=draft_path,
        )

    def engine(self, drafter: str = "draft-model", options: DrafterOptions | None = None) -> SpeculativeEngine:
        drafter_cls = DRAFTERS.get(drafter)
        if drafter_cls.needs_draft_model and self.draft is None:
            raise ConfigError(f"the {drafter} drafter needs a draft model, and none is loaded")
        instance = drafter_cls.create(self.target, self.draft, options or DrafterOptions())
        return SpeculativeEngine(self.target, instance, self.tokenizer, self.eos_token_ids)

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        """Prompt text -> token ids; ``chat`` wraps it as a user turn of the chat template."""
        if not prompt.strip():
            raise PromptError("the prompt is empty: give some text to continue")
        if chat:
            return self.encode_chat([{"role": "user", "content": prompt}])
        return list(self.tokenizer(prompt).input_ids)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """A conversation (``role``/``content`` dicts) through the chat template, ready for the assistant's turn."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise PromptError("this model has no chat template; run without --chat")
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def stream(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        drafter: str = "draft-model",
        chat: bool = False,
        options: DrafterOptions | None = None,
    ) -> GenerationStream:
        return self.engine(drafter, options).stream(self.encode(prompt, chat), config or GenerationConfig())

    def generate(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        drafter: str = "draft-model",
        chat: bool = False,
        options: DrafterOptions | None = None,
    ) -> GenerationResult:
        return self.stream(prompt, config, drafter, chat, options).finish()


def eos_token_ids(model_path: Path, tokenizer: Any) -> frozenset[int]:
    """The tokenizer's end-of-sequence token and those of the model's generation config."""
    from transformers import GenerationConfig as HFGenerationConfig

    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    try:
        configured = HFGenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        configured = None
    if configured is not None:
        ids.update(configured if isinstance(configured, list) else [configured])
    return frozenset(ids)
