#!/usr/bin/env python3
"""Writes the dequantization fixtures of tests/data/gguf/ with the `gguf` package.

For each type: dequant_<TYPE>.bin holds raw ggml blocks and dequant_<TYPE>.f32 holds
gguf.quants.dequantize's output for them (little-endian float32), which the C++ dequantizer
must reproduce bit for bit. Formats that gguf can quantize (F16, BF16, Q8_0, Q4_0, Q4_1) are
quantized from random normal values (with a few outliers and a zero block); for the K-quants,
which gguf cannot quantize, the blocks are random bytes whose f16 scale fields are set to
finite values (every bit pattern of the quant and 6-bit scale fields is a valid block).

The types added later (Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS) come from a second generator,
after the first one's loops, so that the earlier fixtures keep their bytes: Q5_0 and Q5_1 are
quantized as above and followed by random-byte blocks; the others are random bytes with finite
f16 scale fields, one block with a zero and one with a subnormal scale.

Usage: build/pyenv/bin/python3 tools/models/make_gguf_fixtures.py [OUT_DIR]
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES


def finite_f16(rng, n, scale):
    return (rng.standard_normal(n) * scale).astype(np.float16).view(np.uint8).reshape(n, 2)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "..", "tests", "data", "gguf")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(19)
    for qt in (T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1):
        block, _ = GGML_QUANT_SIZES[qt]
        x = rng.standard_normal((8, 256)).astype(np.float32)
        x[1, 5] = 40.0       # an outlier
        x[2, :] = 0.0        # a zero block
        x[3, :] *= 1e-6      # tiny values (subnormal f16 scales)
        raw = quants.quantize(x, qt)
        y = quants.dequantize(raw, qt).astype(np.float32)
        raw.tofile(os.path.join(out, f"dequant_{qt.name}.bin"))
        y.tofile(os.path.join(out, f"dequant_{qt.name}.f32"))
    for qt in (T.Q4_K, T.Q5_K, T.Q6_K):
        _, nbytes = GGML_QUANT_SIZES[qt]
        n = 8
        raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
        if qt in (T.Q4_K, T.Q5_K):
            raw[:, 0:2] = finite_f16(rng, n, 0.01)  # d
            raw[:, 2:4] = finite_f16(rng, n, 0.01)  # dmin
        else:
            raw[:, nbytes - 2:] = finite_f16(rng, n, 0.01)  # d
        y = quants.dequantize(raw, qt).astype(np.float32)
        raw.tofile(os.path.join(out, f"dequant_{qt.name}.bin"))
        y.tofile(os.path.join(out, f"dequant_{qt.name}.f32"))

    # Later types: a separate generator, so that the fixtures above keep their bytes.
    rng = np.random.default_rng(23)
    for qt in (T.Q5_0, T.Q5_1):
        _, nbytes = GGML_QUANT_SIZES[qt]
        x = rng.standard_normal((8, 256)).astype(np.float32)
        x[1, 5] = 40.0       # an outlier
        x[2, :] = 0.0        # a zero block
        x[3, :] *= 1e-6      # tiny values (subnormal f16 scales)
        quantized = quants.quantize(x, qt).reshape(-1, nbytes)
        n = 8
        rand = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
        rand[:, 0:2] = finite_f16(rng, n, 0.01)  # d (either sign)
        if qt == T.Q5_1:
            rand[:, 2:4] = finite_f16(rng, n, 0.01)  # m
        raw = np.concatenate([quantized, rand], axis=0)
        y = quants.dequantize(raw, qt).astype(np.float32)
        raw.tofile(os.path.join(out, f"dequant_{qt.name}.bin"))
        y.tofile(os.path.join(out, f"dequant_{qt.name}.f32"))
    # The f16 fields of each block: (offset, scale of the random values).
    f16_fields = {
        T.Q2_K: ((80, 0.01), (82, 0.01)),  # d, dmin
        T.Q3_K: ((108, 0.01),),            # d
        T.IQ4_NL: ((0, 0.01),),            # d
        T.IQ4_XS: ((0, 0.01),),            # d
    }
    for qt, fields in f16_fields.items():
        _, nbytes = GGML_QUANT_SIZES[qt]
        n = 8 if qt != T.IQ4_NL else 64
        raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
        for at, scale in fields:
            raw[:, at:at + 2] = finite_f16(rng, n, scale)
            raw[1, at:at + 2] = 0                                    # zero scale
            raw[2, at:at + 2] = np.array([0x37, 0x00], np.uint8)     # f16 0x0037: subnormal
        y = quants.dequantize(raw, qt).astype(np.float32)
        raw.tofile(os.path.join(out, f"dequant_{qt.name}.bin"))
        y.tofile(os.path.join(out, f"dequant_{qt.name}.f32"))
    print("wrote", out)


if __name__ == "__main__":
    main()
