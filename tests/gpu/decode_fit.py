#!/usr/bin/env python3
"""What a decode attention call costs before its bytes: time = fixed + bytes / rate.

Reads gpu_bench.json (one JSON object a line, written by `gpu_bench` or `gpu_bench decode`)
and fits, by least squares over its decode attention shapes (rows "decode attention B x L"),
each kind of row as a fixed time a call plus its bytes at a steady rate:

  kvd per call; on the device alone (GPU time); from a one-launch graph; 16 back to back in a
  graph (per launch); a device copy of as many bytes, per call and on the device alone; a plain
  read of them, per call, on the device alone and from a graph.

The bytes of a row are its GB/s times its ms (kvd's: KV, Q and out; the references': what they
move). It prints each kind's fixed microseconds, its rate in GB/s and as a ratio of the copy
ceiling (row "copy d2d 2 GiB (ceiling)"), and its worst miss (the largest distance in
microseconds between a shape's time and the line). Then, per shape, kvd's per-call ratio of
copy as measured, as the fit puts it, with the read's fixed cost in place of kvd's (kvd's rate
and no more overhead a call than a kernel that only reads), the fixed cost a call may have for
the shape to read 0.9 of copy at kvd's rate (negative: not even with none), and kvd's ratio of
copy on the device alone, as measured, beside the plain read's ("-" where gpu_bench wrote no
such row).

"GPU time" rows time each call queued behind a hold that the host releases once the call is
enqueued (gpu_bench's StreamHold), so that they leave out the host's share of a call; the
per-call rows count it where it exceeds the device's start of the kernel.

Usage: decode_fit.py GPU_BENCH_JSON. Exit status 1 when the file is missing or unreadable,
has no copy ceiling, or fewer than two decode shapes per call; 2 on a usage error. A kind of
row with fewer than two shapes is listed as not fitted.
"""
import re
import sys

from compare_peers import load_bench  # beside this script, here and in a bundle

# (label, row name suffix after "decode attention B x L").
KINDS = [
    ("kvd per call", ""),
    ("kvd, GPU time", " (GPU time)"),
    ("kvd, one-launch graph", " (graph)"),
    ("kvd, 16 back to back", " (graph of 16)"),
    ("copy of its bytes", " (copy of its bytes)"),
    ("copy of its bytes, GPU time", " (copy of its bytes, GPU time)"),
    ("read of its bytes", " (read of its bytes)"),
    ("read of its bytes, GPU time", " (read of its bytes, GPU time)"),
    ("read of its bytes, graph", " (read of its bytes, graph)"),
]
TARGET = 0.9  # the ratio of copy for decode batches of 8 or more


def points(rows, suffix):
    """{(B, L): (bytes, microseconds)} of the decode rows ending in `suffix`."""
    found = {}
    pattern = re.compile(r"decode attention (\d+) x (\d+)" + re.escape(suffix))
    for name, row in rows.items():
        m = pattern.fullmatch(name)
        if m and row.get("ms", 0) > 0 and row.get("GB/s", 0) > 0:
            found[(int(m[1]), int(m[2]))] = (row["GB/s"] * row["ms"] * 1e6, row["ms"] * 1e3)
    return found


def fit(pts):
    """Least-squares (fixed us, us per byte) through [(bytes, us)]; None for fewer than two
    distinct byte counts."""
    n = len(pts)
    if n < 2:
        return None
    mean_x = sum(x for x, _ in pts) / n
    mean_y = sum(y for _, y in pts) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in pts) / sxx
    return mean_y - slope * mean_x, slope


def main(argv):
    if len(argv) != 2:
        print("usage: decode_fit.py GPU_BENCH_JSON", file=sys.stderr)
        return 2
    try:
        rows = load_bench(argv[1])
    except (OSError, ValueError, KeyError) as err:
        print(f"decode_fit: {argv[1]}: {err}", file=sys.stderr)
        return 1
    copy = rows.get("copy d2d 2 GiB (ceiling)", {}).get("GB/s", 0)
    if copy <= 0:
        print(f"decode_fit: {argv[1]}: no copy ceiling row", file=sys.stderr)
        return 1
    per_kind = {suffix: points(rows, suffix) for _, suffix in KINDS}
    if fit(list(per_kind[""].values())) is None:
        print(f"decode_fit: {argv[1]}: fewer than two decode shapes per call", file=sys.stderr)
        return 1

    print(f"decode attention, time = fixed + bytes / rate, least squares over the shapes "
          f"(copy ceiling {copy:.1f} GB/s)")
    print(f"{'row':<28}{'fixed us':>9}{'rate GB/s':>11}{'of copy':>9}{'worst miss us':>15}"
          f"{'shapes':>8}")
    lines = {}
    for label, suffix in KINDS:
        pts = list(per_kind[suffix].values())
        line = fit(pts)
        if line is None:
            print(f"{label:<28}not fitted: {len(pts)} shape(s)")
            continue
        fixed, per_byte = line
        lines[suffix] = line
        rate = 1e-3 / per_byte  # bytes per microsecond -> GB/s
        miss = max(abs(y - (fixed + per_byte * x)) for x, y in pts)
        print(f"{label:<28}{fixed:>9.2f}{rate:>11.1f}{rate / copy:>9.3f}{miss:>15.1f}"
              f"{len(pts):>8}")

    kvd_fixed, kvd_per_byte = lines[""]
    read = lines.get(" (read of its bytes)")
    print(f"kvd per call as a ratio of copy: measured, fitted, fitted with the read's fixed cost; "
          f"the fixed us that reads {TARGET} at kvd's rate; on the device alone, kvd and the read")
    print(f"{'shape':<22}{'measured':>9}{'fitted':>9}{'at read':>9}{f'us for {TARGET}':>12}"
          f"{'GPU time':>10}{'read GPU':>10}")
    held = per_kind[" (GPU time)"]
    read_held = per_kind[" (read of its bytes, GPU time)"]
    for (b, l), (x, y) in sorted(per_kind[""].items()):
        at_copy = x * 1e-3 / copy  # microseconds at the copy ceiling
        fitted = at_copy / (kvd_fixed + kvd_per_byte * x)
        read_text = (f"{at_copy / (read[0] + kvd_per_byte * x):>9.3f}" if read
                     else f"{'-':>9}")
        allowed = at_copy / TARGET - kvd_per_byte * x
        held_text = "".join(
            f"{pts[(b, l)][0] * 1e-3 / copy / pts[(b, l)][1]:>10.3f}" if (b, l) in pts
            else f"{'-':>10}" for pts in (held, read_held))
        print(f"{f'decode {b} x {l}':<22}{at_copy / y:>9.3f}{fitted:>9.3f}{read_text}"
              f"{allowed:>12.2f}{held_text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
