"""Drafts from a request's predicted output (OpenAI's Predicted Outputs): the text the user expects back, such
as the file being edited. While the answer follows the prediction, the drafts are the prediction's next tokens.
Where the answer departs from it (an edit), the place is found again by the answer's last tokens, as prompt
lookup finds a continuation: the occurrence nearest after the last place the answer reached, so that an edit
further down the file does not send the drafts back to an earlier copy of the same line.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence


class PredictionCopies:
    """Where one request's answer stands in its prediction, and what to copy from there."""

    def __init__(self, prediction: Sequence[int], max_ngram: int, min_ngram: int, max_copied: int) -> None:
        self.prediction = list(prediction)
        self.max_ngram, self.min_ngram, self.max_copied = max_ngram, min_ngram, max_copied
        self.position: int | None = 0  # the prediction's next token; None: the answer has left the prediction
        self.reached = 0  # the furthest place the answer followed the prediction to
        self.followed = 0  # answer tokens looked at
        self._ends: dict[tuple[int, ...], list[int]] | None = None  # n-gram -> where its occurrences end

    def after(self, answer: Sequence[int]) -> list[int]:
        """The drafts to copy after ``answer`` (the tokens generated so far); empty: the answer is off the
        prediction and its last tokens do not occur in it."""
        for token in answer[self.followed :]:
            position = self.position
            if position is not None and position < len(self.prediction) and self.prediction[position] == token:
                self.position, self.reached = position + 1, max(self.reached, position + 1)
            else:
                self.position = None
        self.followed = len(answer)
        if self.position is None:
            self.position = self._find(answer)
        if self.position is None:
            return []
        return self.prediction[self.position : self.position + self.max_copied]

    def _find(self, answer: Sequence[int]) -> int | None:
        """Where the answer's last ``max_ngram``..``min_ngram`` tokens end in the prediction (the longest that
        occurs), nearest at or after :attr:`reached`, else nearest before it; None when none occurs."""
        ends = self._ngram_ends()
        for n in range(min(self.max_ngram, len(answer)), self.min_ngram - 1, -1):
            found = ends.get(tuple(answer[len(answer) - n :]))
            if found:
                after = bisect.bisect_left(found, self.reached)
                return found[after] if after < len(found) else found[-1]
        return None

    def _ngram_ends(self) -> dict[tuple[int, ...], list[int]]:
        """Every n-gram of the prediction (n = min..max) and the ascending positions just past its occurrences."""
        if self._ends is None:
            self._ends = {}
            for n in range(self.min_ngram, self.max_ngram + 1):
                for end in range(n, len(self.prediction) + 1):
                    self._ends.setdefault(tuple(self.prediction[end - n : end]), []).append(end)
        return self._ends
