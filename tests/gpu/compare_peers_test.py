#!/usr/bin/env python3
"""Specification of tests/gpu/compare_peers.py on made-up benchmark files (no GPU needed):
one run's files, and rounds (--rounds)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compare_peers.py")


def run(bench_rows, peer_rows):
    with tempfile.TemporaryDirectory() as tmp:
        bench = os.path.join(tmp, "gpu_bench.json")
        peers = os.path.join(tmp, "torch_peers.json")
        if bench_rows is not None:
            with open(bench, "w") as f:
                f.write("".join(json.dumps(r) + "\n" for r in bench_rows))
        if peer_rows is not None:
            with open(peers, "w") as f:
                json.dump(peer_rows, f)
        done = subprocess.run([sys.executable, SCRIPT, bench, peers], capture_output=True,
                              text=True)
        return done.returncode, done.stdout, done.stderr


BENCH = [
    {"name": "copy d2d 2 GiB (ceiling)", "ms": 1.0, "GB/s": 4200.0},
    {"name": "decode attention 64 x 4096", "ms": 0.25, "GB/s": 4000.0},
    {"name": "decode attention 64 x 4096 (graph)", "ms": 0.24, "GB/s": 4100.0},
    {"name": "decode attention 64 x 4096 (copy of its bytes)", "ms": 0.245, "GB/s": 4080.0},
    {"name": "decode attention 64 x 4096 (read of its bytes)", "ms": 0.235, "GB/s": 4250.0},
    {"name": "decode attention 1 x 4096", "ms": 0.02, "GB/s": 900.0},
    {"name": "prefill attention 1 x 16384 / 16384", "ms": 4.0, "TFLOP/s": 540.0},
]
PEERS = [
    {"name": "sdpa decode B=64 L=4096", "ms": 0.30},
    {"name": "sdpa[cudnn] decode B=64 L=4096", "ms": 0.20},
    {"name": "sdpa[efficient] decode B=64 L=4096", "ms": -1, "note": "No available kernel"},
    {"name": "sdpa decode B=1 L=4096", "ms": 0.04},
    {"name": "sdpa decode B=8 L=4096", "ms": 0.05},
    {"name": "sdpa prefill causal B=1 L=16384", "ms": 3.4, "TFLOP/s": 600.0},
]


class ComparePeersTest(unittest.TestCase):
    def test_ratios_per_shape_against_default_and_fastest_sdpa(self):
        code, out, err = run(BENCH, PEERS)
        self.assertEqual(code, 0, err)
        lines = {line.split("  ")[0].strip(): line for line in out.splitlines()}
        # 64 x 4k: default SDPA 0.30 ms / kvd 0.25 per call = 1.20; cuDNN 0.20 / 0.25 = 0.80.
        # Per call, from a graph, a copy and a read of as many bytes, SDPA.
        row = lines["decode 64 x 4096"].split()
        self.assertEqual(row[4:11],
                         ["0.2500", "0.2400", "0.2450", "0.2350", "0.3000", "1.20", "0.2000"])
        self.assertEqual(row[11:], ["0.80", "cudnn"])
        # No graph, copy or read row: dashes; the failed backend (ms -1) is not a candidate.
        self.assertEqual(lines["decode 1 x 4096"].split()[5:8], ["-", "-", "-"])
        self.assertTrue(lines["decode 1 x 4096"].rstrip().endswith("default"))
        self.assertIn("missing on the kvd side", lines["decode 8 x 4096"])
        self.assertIn("540.0 vs 600.0  ratio 0.90", lines["prefill 1 x 16384"])

    def test_shapes_only_kvd_measured_are_listed(self):
        # kvd rows SDPA lacks (the peer script skipped or failed them) are listed too, and a
        # prefill from a cached prefix (q_len != context) is no SDPA shape, so not listed.
        code, out, err = run(BENCH + [
            {"name": "decode attention 4 x 131072", "ms": 3.0},
            {"name": "decode attention 4 x 131072 (graph)", "ms": 2.9},
            {"name": "prefill attention 8 x 2048 / 2048", "ms": 1.0, "TFLOP/s": 400.0},
            {"name": "prefill attention 1 x 512 / 4096", "ms": 0.2, "TFLOP/s": 300.0},
        ], PEERS)
        self.assertEqual(code, 0, err)
        lines = {line.split("  ")[0].strip(): line for line in out.splitlines()}
        self.assertIn("missing on the SDPA side", lines["decode 4 x 131072"])
        self.assertIn("missing on the SDPA side", lines["prefill 8 x 2048"])
        self.assertNotIn("prefill 1 x 512", lines)
        self.assertNotIn("prefill 1 x 4096", lines)
        self.assertIn("missing on the kvd side", lines["decode 8 x 4096"])

    def test_no_shape_in_both_files_fails(self):
        code, _, err = run(BENCH[:1], PEERS)
        self.assertEqual(code, 1)
        self.assertIn("no shape in both files", err)

    def test_missing_or_broken_files_fail_with_the_reason(self):
        code, _, err = run(BENCH, None)
        self.assertEqual(code, 1)
        self.assertIn("torch_peers.json", err)
        with tempfile.TemporaryDirectory() as tmp:
            broken = os.path.join(tmp, "gpu_bench.json")
            with open(broken, "w") as f:
                f.write("{not json\n")
            done = subprocess.run([sys.executable, SCRIPT, broken, broken], capture_output=True,
                                  text=True)
            self.assertEqual(done.returncode, 1)
            self.assertIn("compare_peers:", done.stderr)



def run_rounds(rounds):
    """rounds: per round, (list of gpu_bench files' rows, sdpa rows or None for no file)."""
    with tempfile.TemporaryDirectory() as tmp:
        for i, (bench_files, sdpa_rows) in enumerate(rounds):
            round_dir = os.path.join(tmp, str(i + 1))
            os.makedirs(round_dir)
            for j, rows in enumerate(bench_files):  # a folder each, as run.sh's modes
                os.makedirs(os.path.join(round_dir, f"mode{j}"))
                with open(os.path.join(round_dir, f"mode{j}", "gpu_bench.json"), "w") as f:
                    f.write("".join(json.dumps(r) + "\n" for r in rows))
            if sdpa_rows is not None:
                with open(os.path.join(round_dir, "sdpa.json"), "w") as f:
                    json.dump(sdpa_rows, f)
        done = subprocess.run([sys.executable, SCRIPT, "--rounds", tmp], capture_output=True,
                              text=True)
        return done.returncode, done.stdout, done.stderr


def decode_row(ms):
    return {"name": "decode attention 1 x 4096", "ms": ms}


def prefill_row(tflops):
    return {"name": "prefill attention 1 x 16384 / 16384", "ms": 4.0, "TFLOP/s": tflops}


def sdpa_rows(decode_ms, prefill_tflops):
    return [{"name": "sdpa decode B=1 L=4096", "ms": decode_ms},
            {"name": "sdpa prefill causal B=1 L=16384", "ms": 3.5, "TFLOP/s": prefill_tflops}]


class ComparePeersRoundsTest(unittest.TestCase):
    def test_medians_over_rounds_of_times_and_ratios(self):
        # Decode ratios 0.040/0.020 = 2.0, 0.030/0.020 = 1.5, 0.070/0.020 = 3.5 (median 2.0,
        # mean 2.33); prefill 540/600 = 0.90, 600/600 = 1.00, 400/625 = 0.64 (median 0.90,
        # mean 0.85). Each round's kvd rows come from two files (decode and prefill modes).
        code, out, err = run_rounds([
            ([[decode_row(0.020)], [prefill_row(540.0)]], sdpa_rows(0.040, 600.0)),
            ([[decode_row(0.020)], [prefill_row(600.0)]], sdpa_rows(0.030, 600.0)),
            ([[decode_row(0.020)], [prefill_row(400.0)]], sdpa_rows(0.070, 625.0)),
        ])
        self.assertEqual(code, 0, err)
        self.assertIn("3 rounds alternating", out)
        lines = {line.split("  ")[0].strip(): line for line in out.splitlines()}
        self.assertEqual(lines["decode 1 x 4096"].split()[4:],
                         ["0.0200", "0.0400", "2.00", "1.50-3.50", "3"])
        self.assertIn("540.0 vs 600.0  ratio 0.90  range 0.64-1.00  rounds 3",
                      lines["prefill 1 x 16384"])

    def test_rounds_missing_a_side_are_left_out_of_that_shape(self):
        code, out, err = run_rounds([
            ([[decode_row(0.020)]], sdpa_rows(0.040, 600.0)),
            ([[prefill_row(600.0)]], sdpa_rows(0.030, 600.0)),
        ])
        self.assertEqual(code, 0, err)
        lines = {line.split("  ")[0].strip(): line for line in out.splitlines()}
        self.assertEqual(lines["decode 1 x 4096"].split()[-1], "1")
        self.assertIn("rounds 1", lines["prefill 1 x 16384"])

    def test_no_rounds_or_a_round_without_sdpa_fails(self):
        code, _, err = run_rounds([])
        self.assertEqual(code, 1)
        self.assertIn("no round directories", err)
        code, _, err = run_rounds([([[decode_row(0.020)]], None)])
        self.assertEqual(code, 1)
        self.assertIn("sdpa.json", err)
        code, _, err = run_rounds([([[{"name": "copy d2d 2 GiB (ceiling)", "ms": 1.0}]],
                                    sdpa_rows(0.040, 600.0))])
        self.assertEqual(code, 1)
        self.assertIn("no shape in both sides of any round", err)


if __name__ == "__main__":
    unittest.main()
