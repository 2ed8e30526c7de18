"""quickdraft: lossless speculative decoding for large language models."""

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters import DRAFTERS, DrafterOptions
from quickdraft.engine import GenerationResult, SpeculativeEngine
from quickdraft.errors import QuickdraftError
from quickdraft.runtime import RUNTIMES
from quickdraft.stats import GenerationStats

__version__ = "0.1.0"

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
]
