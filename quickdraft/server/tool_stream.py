"""A streamed answer's content with what may open a tool call held back (:mod:`quickdraft.server.tools` reads the
calls from what is held, at the end)."""

from __future__ import annotations


class CallFilter:
    """A streamed answer's text with what may open a call held back: :meth:`feed` gives the content to send now;
    the held text is parsed for calls at the end (:meth:`ToolRequest.split_calls`). ``openers``: what a whole
    answer of calls may open with; ``tags``: what may open a call inside an answer (Hermes' tag), if anything;
    ``only_calls``: the answer is all calls (a constrained one), held whole."""

    def __init__(self, openers: tuple[str, ...], tags: tuple[str, ...] = (), only_calls: bool = False) -> None:
        self.openers, self.tags = openers, tags
        self.text = ""  # all of the answer so far
        self.sent = 0  # characters of it sent as content
        self.whole: bool | None = True if only_calls else None  # the answer opens as a whole answer of calls would
        # (None: not known yet)

    def feed(self, delta: str) -> str:
        self.text += delta
        if self.whole is None:  # decided once its first characters tell
            start = self.text.lstrip()
            if any(start.startswith(opener) for opener in self.openers):
                self.whole = True
            elif not any(opener.startswith(start) for opener in self.openers):
                self.whole = False
        if self.whole is not False:
            return ""  # may be a whole answer of calls: held to the end
        end = len(self.text)
        if self.tags:
            opened = [at for tag in self.tags if (at := self.text.find(tag, self.sent)) >= 0]
            if opened:
                end = min(opened)
            else:  # a tail that may be the start of a tag waits for the next delta
                longest = max(len(tag) for tag in self.tags) - 1
                for size in range(min(longest, len(self.text) - self.sent), 0, -1):
                    if any(tag.startswith(self.text[-size:]) for tag in self.tags):
                        end = len(self.text) - size
                        break
            end = max(self.sent, len(self.text[:end].rstrip()))  # whitespace before a call is not content: held too
        out, self.sent = self.text[self.sent : end], end
        return out
