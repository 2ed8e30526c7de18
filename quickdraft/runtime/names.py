"""The runtime layer's names and defaults that a command's parser shows (devices, weight formats, the draft model's
storage), kept free of torch so that ``--help`` does not import it. The modules that act on them import them here."""

from __future__ import annotations

AUTO = "auto"  # --runtime auto: the native runtime for the families it runs, transformers for the rest
AUTO_DEVICE = "auto"
DEVICE_FORMS = "auto, cpu, cuda or cuda:N"

# How float weights are stored: "auto" keeps a GGUF source's tensors of the types gguf_exact decodes exactly (q4,
# q5, q6, q2, q8, q8m, iq4, iq4h, q4t, q4tm; MXFP4 and NVFP4 tensors only where those formats hold their scales) and
# quantizes the rest to 7-bit int8; "q4" keeps its Q4_K tensors and quantizes the rest to 4 bits (smaller and faster,
# less exact: for draft models); "int8" quantizes everything to 7-bit int8 from the floats.
WEIGHT_FORMATS = ("auto", "q4", "int8")
EXACT_TYPES = {  # the GGUF types each format keeps (MXFP4 and NVFP4 where gguf_exact.DECODES_WHEN allows)
    "auto": (
        *("Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "Q8_0", "Q5_0", "Q4_0", "Q5_1", "Q4_1"),
        *("IQ4_XS", "IQ4_NL", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "TQ2_0", "TQ1_0"),
        *("MXFP4", "NVFP4"),
    ),
    "q4": ("Q4_K",),
    "int8": (),
}

# What the native runtime's KV caches hold keys and values as: float16 by default (half the memory and half the
# reading of long contexts; a half keeps 11 significant bits, more than the 8-bit activation rows every GEMM reads),
# or float32. The transformers runtime keeps its model's dtype.
KV_CACHE_DTYPES = ("float16", "float32")
KV_CACHE_DEFAULT = "float16"

# The draft model's defaults on runtimes that take load options (docs/design.md has the measurements).
DRAFT_WEIGHTS = "q4"
DRAFT_VOCABULARY = 49152  # the most frequent tokens, plus each request's prompt tokens (0: all tokens)
