"""A streamed answer's content with what may open a tool call held back (:mod:`quickdraft.server.tools` reads the
calls from what is held, at the end)."""

from __future__ import annotations


class CallFilter:
    """A streamed answer's text with what may open a call held back: :meth:`feed` gives the content to send now;
    the held text is parsed for calls at the end (:meth:`ToolRequest.split_calls`). ``openers``: what a whole
    answer of calls may open with; ``tag``: what opens a call inside an answer (Hermes'), if anything."""

    def __init__(self, openers: tuple[str, ...], tag: str | None) -> None:
        self.openers, self.tag = openers, tag
        self.text = ""  # all of the answer so far
        self.sent = 0  # characters of it sent as content
        self.whole: bool | None = None  # the answer opens as a whole answer of calls would (None: not known yet)

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
        if self.tag is not None:
            opened = self.text.find(self.tag, self.sent)
            if opened >= 0:
                end = opened
            else:  # a tail that may be the start of the tag waits for the next delta
                for size in range(min(len(self.tag) - 1, len(self.text) - self.sent), 0, -1):
                    if self.tag.startswith(self.text[-size:]):
                        end = len(self.text) - size
                        break
            end = max(self.sent, len(self.text[:end].rstrip()))  # whitespace before a call is not content: held too
        out, self.sent = self.text[self.sent : end], end
        return out
