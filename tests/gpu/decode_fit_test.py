#!/usr/bin/env python3
"""Specification of tests/gpu/decode_fit.py on made-up gpu_bench.json files (no GPU needed)."""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "decode_fit.py")
COPY = {"name": "copy d2d 2 GiB (ceiling)", "ms": 1.0, "GB/s": 3300.0}


def run(rows=None, text=None, args=None):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gpu_bench.json")
        if rows is not None or text is not None:
            with open(path, "w") as f:
                f.write(text if text is not None else "".join(json.dumps(r) + "\n" for r in rows))
        done = subprocess.run([sys.executable, SCRIPT] + (args if args is not None else [path]),
                              capture_output=True, text=True)
        return done.returncode, done.stdout, done.stderr


def row(name, bytes_, us):
    """A gpu_bench row that moved `bytes_` in `us` microseconds."""
    ms = us * 1e-3
    return {"name": name, "ms": ms, "GB/s": bytes_ / (ms * 1e6)}


def line_rows(suffix, fixed_us, gbps, shapes):
    """Rows of the decode shapes (B, L) taking fixed_us plus their KV bytes at gbps."""
    rows = []
    for b, l in shapes:
        kv = b * l * 8 * 128 * 4
        rows.append(row(f"decode attention {b} x {l}{suffix}", kv, fixed_us + kv / (gbps * 1e3)))
    return rows


SHAPES = [(1, 4096), (8, 4096), (64, 4096)]


KINDS = ["kvd per call", "kvd, GPU time", "kvd, one-launch graph", "kvd, 16 back to back",
         "copy of its bytes, GPU time", "copy of its bytes", "read of its bytes, graph",
         "read of its bytes, GPU time", "read of its bytes"]


def table(out):
    """The output's rows by their label (a kind of row, or "decode B x L"): their cells."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"decode \d+ x \d+", line)
        label = m[0] if m else next((k for k in KINDS if line.startswith(k + " ")), None)
        if label is not None:
            rows.setdefault(label, line[len(label):].split())
    return rows


class DecodeFitTest(unittest.TestCase):
    def test_each_kind_of_row_is_a_fixed_cost_plus_its_bytes_at_a_rate(self):
        rows = [COPY]
        rows += line_rows("", 10.0, 3000.0, SHAPES)
        rows += line_rows(" (GPU time)", 2.0, 3000.0, SHAPES)
        rows += line_rows(" (graph)", 8.0, 3000.0, SHAPES)
        rows += line_rows(" (graph of 16)", 3.0, 3000.0, SHAPES)
        rows += line_rows(" (copy of its bytes)", 6.0, 2900.0, SHAPES)
        rows += line_rows(" (copy of its bytes, GPU time)", 1.5, 2900.0, SHAPES)
        rows += line_rows(" (read of its bytes)", 5.0, 3100.0, SHAPES)
        rows += line_rows(" (read of its bytes, GPU time)", 1.0, 3100.0, SHAPES)
        rows += line_rows(" (read of its bytes, graph)", 4.0, 3100.0, SHAPES)
        code, out, err = run(rows)
        self.assertEqual(code, 0, err)
        t = table(out)
        # fixed us, rate GB/s, rate / copy (3300), worst miss, shapes.
        self.assertEqual(t["kvd per call"], ["10.00", "3000.0", "0.909", "0.0", "3"])
        self.assertEqual(t["kvd, GPU time"], ["2.00", "3000.0", "0.909", "0.0", "3"])
        self.assertEqual(t["kvd, one-launch graph"], ["8.00", "3000.0", "0.909", "0.0", "3"])
        self.assertEqual(t["kvd, 16 back to back"], ["3.00", "3000.0", "0.909", "0.0", "3"])
        self.assertEqual(t["copy of its bytes"], ["6.00", "2900.0", "0.879", "0.0", "3"])
        self.assertEqual(t["copy of its bytes, GPU time"], ["1.50", "2900.0", "0.879", "0.0", "3"])
        self.assertEqual(t["read of its bytes"], ["5.00", "3100.0", "0.939", "0.0", "3"])
        self.assertEqual(t["read of its bytes, GPU time"], ["1.00", "3100.0", "0.939", "0.0", "3"])
        self.assertEqual(t["read of its bytes, graph"], ["4.00", "3100.0", "0.939", "0.0", "3"])
        # Per shape: measured and fitted ratio of copy; with the read's 5 us in place of kvd's
        # 10 at kvd's 3000 GB/s; the fixed us at which kvd's rate reads 0.9 of copy. 8 x 4k:
        # 134217728 bytes, 40.67 us at the copy ceiling, 44.74 at kvd's rate:
        # 40.67 / 54.74 = 0.743, 40.67 / 49.74 = 0.818, 40.67 / 0.9 - 44.74 = 0.45. On the device
        # alone: kvd 40.67 / (2 + 44.74) = 0.870, the read 40.67 / (1 + 43.30) = 0.918.
        self.assertEqual(t["decode 8 x 4096"], ["0.743", "0.743", "0.818", "0.45", "0.870", "0.918"])
        self.assertEqual(t["decode 1 x 4096"], ["0.326", "0.326", "0.480", "0.06", "0.670", "0.793"])
        self.assertEqual(t["decode 64 x 4096"], ["0.884", "0.884", "0.897", "3.62", "0.904", "0.937"])

    def test_least_squares_through_points_off_a_line(self):
        # 3, 6 and 9 MB at 3000 GB/s take 1, 2 and 3 us; measured 11, 15 and 13 us. The least
        # squares line: slope 1 us per 3 MB (3000 GB/s), fixed 13 - 2 = 11 us; misses -1, 2, -1.
        rows = [COPY, row("decode attention 1 x 1", 3e6, 11.0),
                row("decode attention 2 x 1", 6e6, 15.0), row("decode attention 3 x 1", 9e6, 13.0)]
        code, out, err = run(rows)
        self.assertEqual(code, 0, err)
        self.assertEqual(table(out)["kvd per call"], ["11.00", "3000.0", "0.909", "2.0", "3"])

    def test_kinds_with_too_few_shapes_are_listed_unfitted(self):
        rows = [COPY] + line_rows("", 10.0, 3000.0, SHAPES[:2])
        rows += line_rows(" (graph)", 8.0, 3000.0, SHAPES[:1])
        code, out, err = run(rows)
        self.assertEqual(code, 0, err)
        t = table(out)
        self.assertEqual(t["kvd, one-launch graph"], ["not", "fitted:", "1", "shape(s)"])
        self.assertEqual(t["read of its bytes"], ["not", "fitted:", "0", "shape(s)"])
        # No read line: no column for it; no row on the device alone: a "-" for each.
        self.assertEqual(t["decode 8 x 4096"], ["0.743", "0.743", "-", "0.45", "-", "-"])

    def test_refuses_files_it_cannot_fit(self):
        code, _, err = run([row("decode attention 1 x 4096", 1e7, 10.0)])
        self.assertEqual(code, 1)
        self.assertIn("no copy ceiling", err)
        code, _, err = run([COPY] + line_rows("", 10.0, 3000.0, SHAPES[:1]))
        self.assertEqual(code, 1)
        self.assertIn("fewer than two decode shapes", err)
        code, _, err = run(text="{not json\n")
        self.assertEqual(code, 1)
        self.assertIn("decode_fit:", err)
        code, _, err = run(args=["/nonexistent/gpu_bench.json"])
        self.assertEqual(code, 1)
        code, _, err = run(args=[])
        self.assertEqual(code, 2)
        self.assertIn("usage", err)


if __name__ == "__main__":
    unittest.main()
