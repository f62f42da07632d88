#!/usr/bin/env python3
"""PyTorch SDPA at gpu_bench's attention shapes only, for rounds that alternate with gpu_bench.

The same measurements as ../shared/peers/torch_peers.py's SDPA rows (decode over contiguous KV
with SDPA's default backend, causal prefill; 32 query heads, 8 KV heads, head_dim 128, bf16,
random data; CUDA events around one call, median of 20 after 3 warm-ups) and rows of the same
names, without its ceilings, backend sweep and HF model, so that a round takes seconds and
run.sh can alternate it with gpu_bench (compare_peers.py --rounds). Unlike torch_peers.py,
the decode rows rotate through random KV copies cycling at least 200 MB, as gpu_bench's decode
rows do, so that at small shapes neither side reads its KV from the 50 MB L2. Needs torch and
a GPU.

Usage: sdpa_shapes.py OUT_JSON   (writes a JSON list of rows; prints each row as it goes)
A shape that fails (e.g. out of memory) gets a row with ms -1 and its error, the others are
still measured, and the file is written whatever happens; exit status 1 when a shape failed.
"""
import json
import sys

import torch
import torch.nn.functional as F

DECODE = [(1, 4096), (1, 32768), (8, 4096), (32, 4096), (64, 4096), (128, 2048), (16, 16384),
          (4, 131072)]
PREFILL = [(1, 4096), (1, 16384), (8, 2048)]
HQ, HKV, D = 32, 8, 128
ROTATE_BYTES = 4 * 50e6  # as gpu_bench's kRotateBytes: 4 x the H200's L2
MAX_SETS = 128           # as gpu_bench's kMaxRotationSets


def rotation_sets(kv_bytes):
    """Copies of a decode shape's KV that calls rotate through (gpu_bench's RotationSets)."""
    return max(1, min(MAX_SETS, -(-int(ROTATE_BYTES) // int(kv_bytes))))


def median_ms(fn, warmup=3, reps=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def main(argv):
    if len(argv) != 2:
        print("usage: sdpa_shapes.py OUT_JSON", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    rows = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    def qkv(b, q_len, kv_len):
        return (torch.randn(b, HQ, q_len, D, device="cuda", dtype=torch.bfloat16),
                torch.randn(b, HKV, kv_len, D, device="cuda", dtype=torch.bfloat16),
                torch.randn(b, HKV, kv_len, D, device="cuda", dtype=torch.bfloat16))

    failures = 0

    def measure(name, make, fn, rate):
        """One shape: a row with its ms and rate, or, if anything fails, one with ms -1 and the
        error (compare_peers.py skips such rows), so one shape never costs the others. make()
        gives a list of (q, k, v) sets; call i runs fn on set i modulo their number."""
        nonlocal failures
        tensors = None
        try:
            tensors = make()
            calls = [0]

            def call():
                fn(*tensors[calls[0] % len(tensors)])
                calls[0] += 1

            ms = median_ms(call)
            emit({"name": name, "ms": round(ms, 4), "sets": len(tensors), **rate(ms)})
        except Exception as err:  # noqa: BLE001 (CUDA OOM, a missing kernel, ...)
            failures += 1
            message = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            emit({"name": name, "ms": -1, "error": f"{type(err).__name__}: {message}"})
        finally:
            del tensors
            torch.cuda.empty_cache()

    try:
        for b, l in DECODE:
            sets = rotation_sets(2 * b * HKV * l * D * 2)
            measure(f"sdpa decode B={b} L={l}", lambda: [qkv(b, 1, l) for _ in range(sets)],
                    lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                    lambda ms: {"GB/s": round(2 * b * HKV * l * D * 2 / ms / 1e6, 1)})
        for b, l in PREFILL:
            measure(f"sdpa prefill causal B={b} L={l}", lambda: [qkv(b, l, l)],
                    lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                   enable_gqa=True),
                    lambda ms: {"TFLOP/s": round(4 * b * HQ * l * l * D / 2 / ms / 1e9, 1)})
    finally:  # the rows measured so far, whatever happened
        with open(argv[1], "w") as f:
            json.dump(rows, f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
