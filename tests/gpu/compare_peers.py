#!/usr/bin/env python3
"""kvd's attention benchmark rows beside PyTorch SDPA's at the same shapes.

Reads gpu_bench.json (one JSON object a line, written by gpu_bench) and torch_peers.json (a
JSON list, written by ../shared/peers/torch_peers.py) from one GPU run and prints, per shape:

  decode  B x L: kvd ms per call and replayed from a CUDA graph, SDPA's default ms, the
                 fastest SDPA backend's ms (and which), and SDPA ms / kvd's ms per call (above
                 1: kvd is faster) against each;
  prefill B x L: kvd and SDPA TFLOP/s and kvd / SDPA.

Usage: compare_peers.py GPU_BENCH_JSON TORCH_PEERS_JSON. Exit status 1 when a file is missing
or unreadable, or when no shape appears in both; shapes one side lacks are listed as such.
"""
import json
import re
import sys


def load_bench(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                row = json.loads(line)
                rows[row["name"]] = row
    return rows


def main(argv):
    if len(argv) != 3:
        print("usage: compare_peers.py GPU_BENCH_JSON TORCH_PEERS_JSON", file=sys.stderr)
        return 2
    try:
        kvd = load_bench(argv[1])
        with open(argv[2]) as f:
            peers = json.load(f)
    except (OSError, ValueError) as err:
        print(f"compare_peers: {err}", file=sys.stderr)
        return 1

    # SDPA rows: "sdpa decode B=1 L=4096", "sdpa[cudnn] decode B=...", "sdpa prefill causal B=...".
    decode = {}   # (B, L) -> {backend: ms}
    prefill = {}  # (B, L) -> TFLOP/s
    for row in peers:
        name, ms = row.get("name", ""), row.get("ms", -1)
        m = re.fullmatch(r"sdpa(?:\[(\w+)\])? decode B=(\d+) L=(\d+)", name)
        if m and ms > 0:
            decode.setdefault((int(m[2]), int(m[3])), {})[m[1] or "default"] = ms
        m = re.fullmatch(r"sdpa prefill causal B=(\d+) L=(\d+)", name)
        if m and row.get("TFLOP/s"):
            prefill[(int(m[1]), int(m[2]))] = row["TFLOP/s"]

    matched = 0
    print("kvd vs PyTorch SDPA (same run). decode: SDPA ms / kvd ms, above 1 = kvd faster")
    print(f"{'shape':<22}{'kvd ms':>9}{'graph ms':>10}{'SDPA ms':>9}{'ratio':>7}"
          f"{'best SDPA ms':>14}{'ratio':>7}  best backend")
    for b, l in sorted(decode):
        call = kvd.get(f"decode attention {b} x {l}")
        graph = kvd.get(f"decode attention {b} x {l} (graph)")
        sdpa = decode[(b, l)]
        shape = f"decode {b} x {l}"
        if call is None or "default" not in sdpa:
            print(f"{shape:<22}missing on the {'kvd' if call is None else 'SDPA'} side")
            continue
        matched += 1
        best_name = min(sdpa, key=sdpa.get)
        best_ms = sdpa[best_name]
        kvd_ms = call["ms"]  # per call, as SDPA's are timed
        graph_text = f"{graph['ms']:>10.4f}" if graph else f"{'-':>10}"
        print(f"{shape:<22}{call['ms']:>9.4f}{graph_text}{sdpa['default']:>9.4f}"
              f"{sdpa['default'] / kvd_ms:>7.2f}{best_ms:>14.4f}{best_ms / kvd_ms:>7.2f}"
              f"  {best_name}")
    print("prefill (causal): kvd TFLOP/s / SDPA TFLOP/s")
    for b, l in sorted(prefill):
        row = kvd.get(f"prefill attention {b} x {l} / {l}")
        shape = f"prefill {b} x {l}"
        if row is None:
            print(f"{shape:<22}missing on the kvd side")
            continue
        matched += 1
        print(f"{shape:<22}{row['TFLOP/s']:>9.1f} vs {prefill[(b, l)]:.1f}"
              f"  ratio {row['TFLOP/s'] / prefill[(b, l)]:.2f}")
    if matched == 0:
        print("compare_peers: no shape in both files", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
