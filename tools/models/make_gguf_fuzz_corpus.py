#!/usr/bin/env python3
"""Writes the seed corpus of the GGUF fuzzer (tests/fuzz/corpus/gguf/seed_*.gguf) with the
gguf package: small files covering every metadata value type, nested arrays, versions 2 and 3,
a custom alignment, one tensor of each supported ggml type, and a few truncations.

Usage: build/pyenv/bin/python3 tools/models/make_gguf_fuzz_corpus.py [OUT_DIR]
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T


def write(path, fill, arch="llama", version=None):
    w = gguf.GGUFWriter(path, arch)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version is not None:  # version 2's layout is version 3's (little-endian)
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(version.to_bytes(4, "little"))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "..", "tests", "fuzz", "corpus", "gguf")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    files = []

    def kvs(w):
        w.add_uint8("t.u8", 200)
        w.add_int8("t.i8", -5)
        w.add_uint16("t.u16", 60000)
        w.add_int16("t.i16", -300)
        w.add_uint32("t.u32", 4000000000)
        w.add_int32("t.i32", -7)
        w.add_float32("t.f32", 1.5)
        w.add_bool("t.bool", True)
        w.add_string("t.str", "héllo")
        w.add_uint64("t.u64", 1 << 40)
        w.add_int64("t.i64", -(1 << 40))
        w.add_float64("t.f64", 2.25)
        w.add_array("t.arr", [1, 2, 3])
        w.add_array("t.strs", ["a", "bc", ""])
        w.add_array("t.nested", [[1, 2], [3]])
    files.append(("seed_kv_types.gguf", kvs, None))

    def tok(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("llama-bpe")
        w.add_token_list(["a", "b", "ab", "<s>"])
        w.add_token_types([1, 1, 1, 3])
        w.add_token_merges(["a b"])
        w.add_bos_token_id(3)
        w.add_eos_token_id(3)
    files.append(("seed_tokenizer.gguf", tok, None))

    def align(w):
        w.add_custom_alignment(64)
        w.add_tensor("x", rng.standard_normal((2, 32)).astype(np.float32))
        w.add_tensor("y", rng.standard_normal((3,)).astype(np.float32))
    files.append(("seed_alignment64.gguf", align, None))

    def v2(w):
        w.add_tensor("x", rng.standard_normal((1, 32)).astype(np.float16))
    files.append(("seed_v2.gguf", v2, 2))

    for qt in (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1):
        def one(w, qt=qt):
            x = rng.standard_normal((2, 256)).astype(np.float32)
            if qt == T.F32:
                w.add_tensor("w", x)
            else:
                w.add_tensor("w", gguf.quants.quantize(x, qt), raw_dtype=qt)
        files.append((f"seed_tensor_{qt.name}.gguf", one, None))
    for qt in (T.Q4_K, T.Q5_K, T.Q6_K):
        def kq(w, qt=qt):
            _, nbytes = gguf.GGML_QUANT_SIZES[qt]
            raw = rng.integers(0, 256, size=(1, nbytes), dtype=np.uint8)
            w.add_tensor("w", raw, raw_dtype=qt)
        files.append((f"seed_tensor_{qt.name}.gguf", kq, None))
    # Types added later: their own generator, so that the seeds above keep their bytes.
    rng2 = np.random.default_rng(23)
    for qt in (T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS):
        def later(w, qt=qt):
            block, nbytes = gguf.GGML_QUANT_SIZES[qt]
            raw = rng2.integers(0, 256, size=(1, 256 // block * nbytes), dtype=np.uint8)
            w.add_tensor("w", raw, raw_dtype=qt)
        files.append((f"seed_tensor_{qt.name}.gguf", later, None))

    for name, fill, version in files:
        write(os.path.join(out, name), fill, version=version)
    # Truncations of the richest file.
    data = open(os.path.join(out, "seed_kv_types.gguf"), "rb").read()
    for n in (3, 10, 23, 40, len(data) // 2, len(data) - 1):
        open(os.path.join(out, f"seed_kv_types_cut{n}.gguf"), "wb").write(data[:n])
    data = open(os.path.join(out, "seed_tensor_Q8_0.gguf"), "rb").read()
    open(os.path.join(out, "seed_tensor_Q8_0_cut.gguf"), "wb").write(data[:-5])
    print("wrote", out)


if __name__ == "__main__":
    main()
