#!/usr/bin/env python3
"""PyTorch SDPA at gpu_bench's attention shapes only, for rounds that alternate with gpu_bench.

The same measurements as ../shared/peers/torch_peers.py's SDPA rows (decode over contiguous KV
with SDPA's default backend, causal prefill; 32 query heads, 8 KV heads, head_dim 128, bf16,
random data; CUDA events around one call, median of 20 after 3 warm-ups) and rows of the same
names, without its ceilings, backend sweep and HF model, so that a round takes seconds and
run.sh can alternate it with gpu_bench (compare_peers.py --rounds). Needs torch and a GPU.

Usage: sdpa_shapes.py OUT_JSON   (writes a JSON list of rows; prints each row as it goes)
"""
import json
import sys

import torch
import torch.nn.functional as F

DECODE = [(1, 4096), (1, 32768), (8, 4096), (32, 4096), (64, 4096), (128, 2048), (16, 16384),
          (4, 131072)]
PREFILL = [(1, 4096), (1, 16384), (8, 2048)]
HQ, HKV, D = 32, 8, 128


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

    for b, l in DECODE:
        q, k, v = qkv(b, 1, l)
        ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        emit({"name": f"sdpa decode B={b} L={l}", "ms": round(ms, 4),
              "GB/s": round(2 * b * HKV * l * D * 2 / ms / 1e6, 1)})
        del q, k, v
        torch.cuda.empty_cache()
    for b, l in PREFILL:
        q, k, v = qkv(b, l, l)
        ms = median_ms(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
        emit({"name": f"sdpa prefill causal B={b} L={l}", "ms": round(ms, 4),
              "TFLOP/s": round(4 * b * HQ * l * l * D / 2 / ms / 1e9, 1)})
        del q, k, v
        torch.cuda.empty_cache()
    with open(argv[1], "w") as f:
        json.dump(rows, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
