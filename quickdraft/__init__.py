"""quickdraft: lossless speculative decoding for large language models.

The names below are imported on first use (PEP 562), so importing the package, or a light module of it such as the
command line's entry, does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quickdraft.lazy import lazy_exports
from quickdraft.version import __version__

if TYPE_CHECKING:
    from quickdraft.api import Pipeline
    from quickdraft.config import GenerationConfig, LogitAdjustments, SamplingParams
    from quickdraft.drafters import DRAFTERS, DrafterOptions
    from quickdraft.engine import Engine, GenerationResult, Request
    from quickdraft.errors import QuickdraftError
    from quickdraft.runtime import RUNTIMES
    from quickdraft.stats import GenerationStats

# exported name -> the module that defines it
EXPORTS = {
    "DRAFTERS": "quickdraft.drafters",
    "RUNTIMES": "quickdraft.runtime",
    "DrafterOptions": "quickdraft.drafters",
    "Engine": "quickdraft.engine",
    "GenerationConfig": "quickdraft.config",
    "GenerationResult": "quickdraft.engine",
    "GenerationStats": "quickdraft.stats",
    "LogitAdjustments": "quickdraft.config",
    "Pipeline": "quickdraft.api",
    "QuickdraftError": "quickdraft.errors",
    "Request": "quickdraft.engine",
    "SamplingParams": "quickdraft.config",
}


__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)


__all__ = [  # a literal list, so that type checkers and linters see the imports above as the package's exports
    "DRAFTERS",
    "RUNTIMES",
    "DrafterOptions",
    "Engine",
    "GenerationConfig",
    "GenerationResult",
    "GenerationStats",
    "LogitAdjustments",
    "Pipeline",
    "QuickdraftError",
    "Request",
    "SamplingParams",
    "__version__",
]
