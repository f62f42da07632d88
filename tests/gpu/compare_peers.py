#!/usr/bin/env python3
"""kvd's attention benchmark rows beside PyTorch SDPA's at the same shapes.

Reads gpu_bench.json (one JSON object a line, written by gpu_bench) and torch_peers.json (a
JSON list, written by ../shared/peers/torch_peers.py) from one GPU run and prints, per shape:

  decode  B x L: kvd ms per call and replayed from a CUDA graph, the ms per call of a device
                 copy moving as many bytes (what the simplest op reaches at that size) and of a
                 plain kernel that only reads them (both references, not bounds), SDPA's
                 default ms, the fastest SDPA backend's ms (and which), and SDPA ms / kvd's ms
                 per call (above 1: kvd is faster) against each;
  prefill B x L: kvd and SDPA TFLOP/s and kvd / SDPA.

Usage: compare_peers.py GPU_BENCH_JSON TORCH_PEERS_JSON. Exit status 1 when a file is missing
or unreadable, or when no shape appears in both; shapes one side lacks (either side) are
listed as "missing on the kvd side" or "missing on the SDPA side".

Rounds: compare_peers.py --rounds DIR, where each subdirectory of DIR is one round of kvd's and
SDPA's measurements taken back to back (run.sh alternates `gpu_bench decode`, `gpu_bench
prefill` and sdpa_shapes.py): its gpu_bench*.json files (JSON lines, at any depth) and its
sdpa.json (a JSON list as torch_peers.py writes). Prints per shape the median over rounds of
kvd's and SDPA's times and of the rounds' ratios, and the ratios' range: a comparison less
exposed to the machine's drift (clock, SDPA's own spread) over a run than one figure from each
side. Exit status 1 when DIR has no round, a round's files are unreadable, or no shape is in
any round.
"""
import glob
import json
import os
import re
import statistics
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


def kvd_decode(kvd, b, l):
    """kvd's per-call decode row at batch b, context l (None if absent)."""
    return kvd.get(f"decode attention {b} x {l}")


def kvd_prefill(kvd, b, l):
    """kvd's causal prefill row of b sequences of l tokens (None if absent)."""
    return kvd.get(f"prefill attention {b} x {l} / {l}")


def kvd_shapes(kvd):
    """The (B, L) of kvd's per-call decode rows and of its causal prefill rows (a prompt of L
    tokens from empty), the rows compared with SDPA's."""
    decode, prefill = set(), set()
    for name in kvd:
        m = re.fullmatch(r"decode attention (\d+) x (\d+)", name)
        if m:
            decode.add((int(m[1]), int(m[2])))
        m = re.fullmatch(r"prefill attention (\d+) x (\d+) / (\d+)", name)
        if m and m[2] == m[3]:
            prefill.add((int(m[1]), int(m[2])))
    return decode, prefill


def parse_peers(peers):
    """SDPA rows ("sdpa decode B=1 L=4096", "sdpa[cudnn] decode B=...", "sdpa prefill causal
    B=...") as ({(B, L): {backend: ms}}, {(B, L): TFLOP/s})."""
    decode = {}
    prefill = {}
    for row in peers:
        name, ms = row.get("name", ""), row.get("ms", -1)
        m = re.fullmatch(r"sdpa(?:\[(\w+)\])? decode B=(\d+) L=(\d+)", name)
        if m and ms > 0:
            decode.setdefault((int(m[2]), int(m[3])), {})[m[1] or "default"] = ms
        m = re.fullmatch(r"sdpa prefill causal B=(\d+) L=(\d+)", name)
        if m and row.get("TFLOP/s"):
            prefill[(int(m[1]), int(m[2]))] = row["TFLOP/s"]
    return decode, prefill


def rounds_main(root):
    rounds = sorted(d for d in glob.glob(os.path.join(root, "*")) if os.path.isdir(d))
    if not rounds:
        print(f"compare_peers: no round directories in {root}", file=sys.stderr)
        return 1
    decode = {}   # (B, L) -> [(kvd ms per call, SDPA default ms)], one per round with both
    prefill = {}  # (B, L) -> [(kvd TFLOP/s, SDPA TFLOP/s)]
    for round_dir in rounds:
        try:
            kvd = {}
            for path in sorted(glob.glob(os.path.join(round_dir, "**", "gpu_bench*.json"),
                                         recursive=True)):
                kvd.update(load_bench(path))
            with open(os.path.join(round_dir, "sdpa.json")) as f:
                sdpa_decode, sdpa_prefill = parse_peers(json.load(f))
        except (OSError, ValueError) as err:
            print(f"compare_peers: {err}", file=sys.stderr)
            return 1
        for (b, l), backends in sdpa_decode.items():
            call = kvd_decode(kvd, b, l)
            if call is not None and "default" in backends:
                decode.setdefault((b, l), []).append((call["ms"], backends["default"]))
        for (b, l), tflops in sdpa_prefill.items():
            row = kvd_prefill(kvd, b, l)
            if row is not None and row.get("TFLOP/s"):
                prefill.setdefault((b, l), []).append((row["TFLOP/s"], tflops))
    if not decode and not prefill:
        print("compare_peers: no shape in both sides of any round", file=sys.stderr)
        return 1
    median = statistics.median
    print(f"kvd vs PyTorch SDPA, {len(rounds)} rounds alternating: medians over rounds, and the "
          "range of the rounds' ratios")
    print("decode: SDPA ms / kvd ms per call, above 1 = kvd faster")
    print(f"{'shape':<22}{'kvd ms':>9}{'SDPA ms':>9}{'ratio':>7}  range        rounds")
    for (b, l), pairs in sorted(decode.items()):
        ratios = [sdpa / kvd for kvd, sdpa in pairs]
        print(f"{f'decode {b} x {l}':<22}{median(k for k, _ in pairs):>9.4f}"
              f"{median(s for _, s in pairs):>9.4f}{median(ratios):>7.2f}"
              f"  {min(ratios):.2f}-{max(ratios):.2f}{len(pairs):>11}")
    print("prefill (causal): kvd TFLOP/s / SDPA TFLOP/s")
    for (b, l), pairs in sorted(prefill.items()):
        ratios = [kvd / sdpa for kvd, sdpa in pairs]
        print(f"{f'prefill {b} x {l}':<22}{median(k for k, _ in pairs):>9.1f} vs "
              f"{median(s for _, s in pairs):.1f}  ratio {median(ratios):.2f}"
              f"  range {min(ratios):.2f}-{max(ratios):.2f}  rounds {len(pairs)}")
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--rounds":
        return rounds_main(argv[2])
    if len(argv) != 3:
        print("usage: compare_peers.py GPU_BENCH_JSON TORCH_PEERS_JSON\n"
              "       compare_peers.py --rounds DIR", file=sys.stderr)
        return 2
    try:
        kvd = load_bench(argv[1])
        with open(argv[2]) as f:
            peers = json.load(f)
    except (OSError, ValueError) as err:
        print(f"compare_peers: {err}", file=sys.stderr)
        return 1

    decode, prefill = parse_peers(peers)

    matched = 0
    print("kvd vs PyTorch SDPA (same run). decode: SDPA ms / kvd ms, above 1 = kvd faster")
    print(f"{'shape':<22}{'kvd ms':>9}{'graph ms':>10}{'copy ms':>9}{'read ms':>9}{'SDPA ms':>9}"
          f"{'ratio':>7}"
          f"{'best SDPA ms':>14}{'ratio':>7}  best backend")
    kvd_decode_shapes, kvd_prefill_shapes = kvd_shapes(kvd)
    for b, l in sorted(set(decode) | kvd_decode_shapes):
        call = kvd_decode(kvd, b, l)
        graph = kvd.get(f"decode attention {b} x {l} (graph)")
        copy = kvd.get(f"decode attention {b} x {l} (copy of its bytes)")
        read = kvd.get(f"decode attention {b} x {l} (read of its bytes)")
        sdpa = decode.get((b, l), {})
        shape = f"decode {b} x {l}"
        if call is None or "default" not in sdpa:
            print(f"{shape:<22}missing on the {'kvd' if call is None else 'SDPA'} side")
            continue
        matched += 1
        best_name = min(sdpa, key=sdpa.get)
        best_ms = sdpa[best_name]
        kvd_ms = call["ms"]  # per call, as SDPA's are timed
        graph_text = f"{graph['ms']:>10.4f}" if graph else f"{'-':>10}"
        copy_text = f"{copy['ms']:>9.4f}" if copy else f"{'-':>9}"
        read_text = f"{read['ms']:>9.4f}" if read else f"{'-':>9}"
        print(f"{shape:<22}{call['ms']:>9.4f}{graph_text}{copy_text}{read_text}"
              f"{sdpa['default']:>9.4f}"
              f"{sdpa['default'] / kvd_ms:>7.2f}{best_ms:>14.4f}{best_ms / kvd_ms:>7.2f}"
              f"  {best_name}")
    print("prefill (causal): kvd TFLOP/s / SDPA TFLOP/s")
    for b, l in sorted(set(prefill) | kvd_prefill_shapes):
        row = kvd_prefill(kvd, b, l)
        shape = f"prefill {b} x {l}"
        if row is None or (b, l) not in prefill:
            print(f"{shape:<22}missing on the {'kvd' if row is None else 'SDPA'} side")
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
