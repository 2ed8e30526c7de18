"""quickdraft: lossless speculative decoding for large language models."""

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters import DRAFTERS, DrafterOptions
from quickdraft.engine import GenerationResult, SpeculativeEngine
from quickdraft.errors import QuickdraftError
from quickdraft.runtime import RUNTIMES
from quickdraft.stats import GenerationStats
from quickdraft.version import __version__

__all__ = [
    "DRAFTERS",
    "RUNTIMES",
    "DrafterOptions",
    "GenerationConfig",
    "GenerationResult",
    "GenerationStats",
    "Pipeline",
    "QuickdraftError",
    "SamplingParams",
    "SpeculativeEngine",
    "__version__",
]
