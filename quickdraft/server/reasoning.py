"""A thinking model's reasoning apart from its answer: a chat message's ``reasoning_content``, as llama-server and
vLLM's reasoning parsers give it.

Rules:
- Found once per chat template (:func:`quickdraft.prompts.thinking_of`): a template that writes a pair of
  :data:`~quickdraft.prompts.THINK_TAGS` (``<think>``
  and ``</think>``: Qwen3, DeepSeek-R1, SmolLM3; ``[THINK]`` and ``[/THINK]``: Magistral) has its model's reasoning
  split off, unless the server runs with ``--reasoning-format none``. Where the tags are special tokens, every chat
  request keeps their text in its answer (``GenerationConfig.kept_special_tokens``), split or not. Below, ``<think>``
  stands for the template's opening tag and ``</think>`` for its closing one.
- An answer thinks from its start when the template's opening of the assistant's turn (``generation_prompt``, with
  the request's ``chat_template_kwargs``) leaves a ``<think>`` open, unless a grammar constrains the answer (it holds
  from the first token, so no ``</think>`` could come), or when it opens with ``<think>`` itself (leading whitespace
  aside). Its reasoning is then its text up to ``</think>`` (all of it when the answer ends first), and its content
  what follows, without leading whitespace. Any other answer is all content: a ``<think>`` later in it is text.
- Streamed, reasoning and content go out as deltas of their own; what may still be the opening tag, or the start of
  the closing one, waits for the next delta. Both ways give the same text. Tool calls are looked for in the content.
- ``/v1/responses`` gives the reasoning as a ``reasoning`` item before the message (``responses_output``).
  Completions get the answer's text whole. Chat's log-probabilities cover every token of a choice, reasoning
  included.
"""

from __future__ import annotations

from dataclasses import dataclass

from quickdraft.prompts import ThinkTags


@dataclass(frozen=True)
class Thinking:
    """A request's reasoning split: whether its answer starts inside a think block the template opened."""

    opened_by_prompt: bool
    tags: ThinkTags

    def split(self, text: str) -> tuple[str | None, str]:
        """A whole answer's reasoning (None when it did not think) and content."""
        stripped = text.lstrip()
        if not self.opened_by_prompt and not stripped.startswith(self.tags.open):
            return None, text
        inside = stripped.removeprefix(self.tags.open) if not self.opened_by_prompt else text
        reasoning, closed, after = inside.partition(self.tags.close)
        return reasoning, after.lstrip() if closed else ""

    def stream(self) -> ThinkingFilter:
        return ThinkingFilter(self.opened_by_prompt, self.tags)


def opened_by(generation_prompt: str, tags: ThinkTags) -> bool:
    """Whether the text opening the assistant's turn leaves a think block open."""
    return generation_prompt.rfind(tags.open) > generation_prompt.rfind(tags.close)


class ThinkingFilter:
    """A streamed answer's text split as :meth:`Thinking.split` splits it whole: :meth:`feed` gives the reasoning and
    the content to send now; :meth:`finish` what was held at the end."""

    def __init__(self, opened_by_prompt: bool, tags: ThinkTags) -> None:
        self.open, self.close = tags.open, tags.close
        self.state = "reasoning" if opened_by_prompt else "start"  # start -> reasoning -> content, or start -> content
        self.held = ""  # text not sent yet: what may be the opening tag, or the start of the closing one
        self.after_close = False  # the content has started: its leading whitespace is left out

    def feed(self, delta: str) -> tuple[str, str]:
        self.held += delta
        if self.state == "start":
            stripped = self.held.lstrip()
            if stripped.startswith(self.open):
                self.state, self.held = "reasoning", stripped.removeprefix(self.open)
            elif self.open.startswith(stripped):
                return "", ""  # may still open with the tag
            else:
                self.state = "content"
        if self.state == "reasoning":
            reasoning, closed, after = self.held.partition(self.close)
            if closed:
                self.state, self.held, self.after_close = "content", after, True
                return reasoning, self._content()
            sizes = range(min(len(self.close) - 1, len(self.held)), 0, -1)
            keep = next((size for size in sizes if self.close.startswith(self.held[-size:])), 0)
            sent, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
            return sent, ""
        return "", self._content()

    def finish(self) -> tuple[str, str]:
        """The held text at the answer's end: an unclosed block's last reasoning, or content."""
        held, self.held = self.held, ""
        if self.state == "reasoning":
            return held, ""
        return "", held.lstrip() if self.after_close else held

    def _content(self) -> str:
        content, self.held = self.held, ""
        if self.after_close:
            content = content.lstrip()
            self.after_close = not content  # whitespace alone: the next delta may still start with more
        return content
