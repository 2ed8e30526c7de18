"""quickdraft: lossless speculative decoding for large language models."""

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, LogitAdjustments, SamplingParams
from quickdraft.drafters import DRAFTERS, DrafterOptions
from quickdraft.engine import Engine, GenerationResult, Request
from quickdraft.errors import QuickdraftError
from quickdraft.runtime import RUNTIMES
from quickdraft.stats import GenerationStats
from quickdraft.version import __version__

__all__ = [
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
