"""Requantize a GGUF file with llama.cpp's quantizer (llama-cpp-python): requantize.py SRC DST FTYPE.

FTYPE is llama.cpp's file type number (12 = Q3_K_M, 10 = Q2_K). Requantizing a Q4_K_M file loses more than
quantizing from 16 bits would; it is how these runs got low-bit files offline, not how a user should make them.
"""

import ctypes
import sys

import llama_cpp

source, destination, file_type = sys.argv[1], sys.argv[2], int(sys.argv[3])
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = file_type
params.allow_requantize = True
params.nthread = 2
print("rc", llama_cpp.llama_model_quantize(source.encode(), destination.encode(), ctypes.byref(params)))
