"""Errors that carry a message meant for the user.

Every failure caused by input (arguments, model files, prompts) raises a subclass of
:class:`QuickdraftError`. The CLI prints its message on one line and exits non-zero;
anything else reaching the top level is a bug and keeps its traceback.
"""

from __future__ import annotations


class QuickdraftError(Exception):
    """Base class: the message is complete and says how to fix the problem; ``setting`` names the library setting
    (``runtime``, ``max_new_tokens``, ...) at fault or that would fix it, where there is one, so that the CLI can add
    its flag and a server its request field."""

    def __init__(self, message: str, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class ConfigError(QuickdraftError, ValueError):
    """An invalid generation or drafter setting (max_new_tokens, temperature, ...); ``setting`` names the one that is
    wrong where there is one (a server reports it as the request's field)."""


class PromptError(QuickdraftError, ValueError):
    """The prompt is empty or does not fit into the model's context; ``setting``: the one that would make room."""


class ModelFilesError(QuickdraftError):
    """Model files are missing, incomplete or corrupt."""


class TokenizerMismatchError(QuickdraftError):
    """Draft and target models do not share one tokenizer."""


class UnknownNameError(QuickdraftError, KeyError):
    """A registry lookup with a name that is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class CacheError(QuickdraftError):
    """Files in quickdraft's cache could not be deleted or written (permissions, a full disk)."""
