#!/usr/bin/env python3
"""Specification of tests/gpu/paired_prefill.py without a GPU or torch: a stand-in for
`gpu_bench paired` speaks its protocol, and a stand-in SDPA returns set times."""
import importlib.util
import json
import os
import stat
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("paired_prefill",
                                              os.path.join(HERE, "paired_prefill.py"))
paired = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paired)

# A stand-in for `gpu_bench paired`: offers the shapes in $FAKE_SHAPES ("B,R,C;..."), answers
# each call with $FAKE_MS, logging "kvd" to $FAKE_LOG; $FAKE_BREAK_AFTER calls in all, it
# exits 1 instead of answering; $FAKE_GARBAGE answers the first call with that text.
FAKE_BENCH = textwrap.dedent("""\
    import os, sys
    assert sys.argv[1:] == ["paired"], sys.argv
    assert "OUT" not in os.environ
    calls = 0
    for shape in os.environ["FAKE_SHAPES"].split(";"):
        print("shape " + shape.replace(",", " "), flush=True)
        for line in sys.stdin:
            line = line.strip()
            if line == "next":
                break
            assert line == "call", line
            calls += 1
            if calls > int(os.environ.get("FAKE_BREAK_AFTER", "1000000")):
                sys.exit(1)
            with open(os.environ["FAKE_LOG"], "a") as log:
                log.write("kvd\\n")
            if os.environ.get("FAKE_GARBAGE"):
                print(os.environ["FAKE_GARBAGE"], flush=True)
            else:
                print("ms " + os.environ["FAKE_MS"], flush=True)
        else:
            sys.exit(0)
    print("done", flush=True)
    """)


class PairedPrefillTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.bench = os.path.join(self.tmp.name, "gpu_bench")
        with open(self.bench, "w") as f:
            f.write(f"#!{sys.executable}\n" + FAKE_BENCH)
        os.chmod(self.bench, os.stat(self.bench).st_mode | stat.S_IXUSR)
        self.log = os.path.join(self.tmp.name, "calls.log")
        self.out = os.path.join(self.tmp.name, "paired.json")
        self.env = {"FAKE_SHAPES": "1,4096,4096;8,2048,2048", "FAKE_MS": "2.0",
                    "FAKE_LOG": self.log, "OUT": self.tmp.name}
        self.sdpa_shapes = []

    def run_main(self, args, sdpa_ms=1.8, env=None):
        def make_sdpa(batch, rows, context):
            self.sdpa_shapes.append((batch, rows, context))

            def call():
                with open(self.log, "a") as log:
                    log.write("sdpa\n")
                return sdpa_ms

            return call

        saved = dict(os.environ)
        os.environ.update(env or self.env)
        try:
            return paired.main(["paired_prefill.py", self.bench, self.out] + args, make_sdpa)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def rows(self):
        with open(self.out) as f:
            return json.load(f)

    def calls(self):
        with open(self.log) as f:
            return f.read().split()

    def test_each_shape_gets_a_row_of_paired_ratios(self):
        self.assertEqual(self.run_main(["5"]), 0)
        self.assertEqual(self.sdpa_shapes, [(1, 4096, 4096), (8, 2048, 2048)])
        rows = self.rows()
        self.assertEqual([r["name"] for r in rows],
                         ["paired prefill causal B=1 L=4096", "paired prefill causal B=8 L=2048"])
        for row in rows:
            self.assertEqual(row["pairs"], 5)
            self.assertEqual((row["kvd ms"], row["sdpa ms"]), (2.0, 1.8))
            # kvd's rate over SDPA's: SDPA's time over kvd's.
            self.assertEqual((row["ratio"], row["ratio q1"], row["ratio q3"]), (0.9, 0.9, 0.9))
        # 1 x 4k causal: 4 * 4096 * 2048 * 32 * 128 flops in 2 ms.
        self.assertAlmostEqual(rows[0]["kvd TFLOP/s"], 4 * 4096 * 2048 * 32 * 128 / 2e9, delta=0.1)

    def test_calls_alternate_and_the_order_swaps_every_pair(self):
        self.assertEqual(self.run_main(["4"]), 0)
        warmup = ["kvd", "sdpa"] * paired.WARMUP
        pairs = ["kvd", "sdpa", "sdpa", "kvd", "kvd", "sdpa", "sdpa", "kvd"]
        self.assertEqual(self.calls(), (warmup + pairs) * 2)

    def test_ratio_is_the_median_of_the_pairs_not_of_the_sides(self):
        ours = [1.0, 2.0, 4.0]
        theirs = [1.0, 1.0, 2.0]  # ratios 1.0, 0.5, 0.5: median 0.5
        row = paired.summarize(1, 4096, 4096, ours, theirs)
        self.assertEqual(row["ratio"], 0.5)
        # The sides' medians (2.0 and 1.0) give 0.5 too; here they give 1.0, the pairs 2/3:
        row = paired.summarize(1, 4096, 4096, [1.0, 2.0, 3.0], [3.0, 1.0, 2.0])
        self.assertEqual((row["kvd ms"], row["sdpa ms"]), (2.0, 2.0))
        self.assertEqual(row["ratio"], 0.6667)
        self.assertEqual((row["ratio q1"], row["ratio q3"]), (0.5, 3.0))

    def test_a_bench_that_stops_early_fails_and_keeps_the_rows_done(self):
        env = dict(self.env, FAKE_BREAK_AFTER=str(paired.WARMUP + 3 + 2))
        self.assertEqual(self.run_main(["3"], env=env), 1)
        self.assertEqual([r["name"] for r in self.rows()], ["paired prefill causal B=1 L=4096"])

    def test_an_sdpa_failure_costs_its_shape_only(self):
        def make_sdpa(batch, rows, context):
            if batch == 1:
                raise RuntimeError("CUDA out of memory")

            def call():
                with open(self.log, "a") as log:
                    log.write("sdpa\n")
                return 1.8

            return call

        saved = dict(os.environ)
        os.environ.update(self.env)
        try:
            code = paired.main(["paired_prefill.py", self.bench, self.out, "3"], make_sdpa)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.assertEqual(code, 1)
        rows = self.rows()
        self.assertEqual(rows[0], {"name": "paired prefill causal B=1 L=4096",
                                   "error": "CUDA out of memory"})
        self.assertEqual((rows[1]["name"], rows[1]["pairs"], rows[1]["ratio"]),
                         ("paired prefill causal B=8 L=2048", 3, 0.9))

    def test_a_bench_that_says_something_else_fails(self):
        env = dict(self.env, FAKE_GARBAGE="ms fast")
        self.assertEqual(self.run_main(["3"], env=env), 1)
        self.assertEqual(self.rows(), [])

    def test_a_bench_that_offers_nothing_fails(self):
        env = dict(self.env, FAKE_SHAPES="")
        with open(self.bench, "w") as f:  # as gpu_bench without a GPU: exits 0, says nothing
            f.write(f"#!{sys.executable}\nimport sys\nsys.exit(0)\n")
        self.assertEqual(self.run_main([], env=env), 1)
        self.assertEqual(self.rows(), [])

    def test_usage_errors(self):
        for args in (["0"], ["x"], ["3", "4"]):
            self.assertEqual(self.run_main(args), 2, args)
        self.assertEqual(paired.main(["paired_prefill.py", self.bench]), 2)


if __name__ == "__main__":
    unittest.main()
