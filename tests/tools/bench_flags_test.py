#!/usr/bin/env python3
"""The benchmarks' command lines (kvd_cpu_bench, `kvd bench`, gpu_bench), as specifications: a
bad flag value is a usage error (exit 2) whose message names the flag and the value as typed,
refused before any model is built (no table, no header on stdout; with kvd_cpu_bench, before
its --model is even opened); --help tells the ranges. gpu_bench (CUDA builds) is run only for
--help and for argument and environment errors, which it refuses before any CUDA call, so
this runs on machines without a GPU and never starts a measurement on one with a GPU.

  bench_flags_test.py --cpu-bench PATH --kvd PATH [--gpu-bench=PATH]
"""
import argparse
import os
import re
import subprocess
import sys
import time
import unittest

# Each a command line: a program, then (`kvd bench`) its subcommand.
BENCHES = {"cpu": [], "e2e": [], "gpu": []}

# A refusal parses flags and prints; anything near this long built or ran something (a
# sanitizer build, on a loaded machine, still starts in well under a second).
MAX_REFUSAL_SECONDS = 10.0

# Small enough for the CPU in a second: if a bad flag got past the checks, `kvd bench` would
# build this model and print its header and a row.
E2E_TINY = ["--device", "cpu", "--model", "synthetic:tiny", "--cases", "1x16", "--steps", "1",
            "--warmup", "0", "--graphs", "off", "--threads", "1"]


def run(command, args, env=None):
    """(exit status, stdout, stderr, seconds) of `command args`."""
    full_env = dict(os.environ)
    full_env.pop("OUT", None)  # kvd bench and gpu_bench would write files there
    full_env.update(env or {})
    start = time.monotonic()
    done = subprocess.run(command + args, capture_output=True, text=True, env=full_env,
                          timeout=300)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - start


def names_value(line, value):
    """True when `line` holds `value` as typed, as a word of its own or quoted."""
    if value == "":
        return "''" in line
    return re.search(r"(^|[\s'\"=])" + re.escape(value) + r"($|[\s'\",;:])", line) is not None


class RefusalMixin:
    program = ""  # the name every message starts with

    def assert_refused(self, command, args, flag, value, env=None):
        code, out, err, seconds = run(command, args, env)
        what = "%s %s" % (" ".join("%s=%s" % kv for kv in (env or {}).items()), " ".join(args))
        self.assertEqual(code, 2, "%s: exit %d\nstdout:\n%s\nstderr:\n%s" % (what, code, out, err))
        first = err.splitlines()[0] if err else ""
        # The first line is the error; the usage that follows names every flag anyway.
        self.assertTrue(first.startswith(self.program + ": "), "%s: %r" % (what, first))
        self.assertIn(flag, first, what)
        self.assertTrue(names_value(first, value), "%s: %r does not name %r" % (what, first, value))
        self.assertIn("usage: ", err, what)
        self.assertEqual(out, "", "%s: printed a benchmark's output" % what)
        self.assertLess(seconds, MAX_REFUSAL_SECONDS, what)


class CpuBenchTest(RefusalMixin, unittest.TestCase):
    program = "kvd_cpu_bench"

    def test_bad_values_are_usage_errors_before_the_model_is_opened(self):
        # A model that does not exist: had the flags been judged after loading it, the error
        # would be about the model, with exit status 1.
        missing = ["--model", "/nonexistent/stories260K.bin"]
        for flag, value in [("--repeats", "0"), ("--repeats", "-1"), ("--repeats", "abc"),
                            ("--repeats", "2147483648"), ("--threads", "-3"),
                            ("--threads", "1025"), ("--threads", "4294967297"),
                            ("--threads", "1.5")]:
            with self.subTest(flag=flag, value=value):
                self.assert_refused(BENCHES["cpu"], missing + [flag, value], flag, value)

    def test_unknown_flag_and_missing_value(self):
        self.assert_refused(BENCHES["cpu"], ["--repeat", "2"], "--repeat", "--repeat")
        self.assert_refused(BENCHES["cpu"], ["--threads"], "--threads", "--threads")

    def test_help_shows_the_ranges(self):
        code, out, err, _ = run(BENCHES["cpu"], ["--help"])
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"--threads .*range \[0, 1024\]")
        self.assertRegex(out, r"--repeats .*range \[1, 2147483647\]")

    def test_a_model_that_cannot_load_is_a_runtime_error_naming_the_program(self):
        code, out, err, _ = run(BENCHES["cpu"], ["--model", "/nonexistent/stories260K.bin"])
        self.assertEqual(code, 1, err)
        self.assertEqual(out, "")
        errors = [l for l in err.splitlines() if "note:" not in l]
        self.assertTrue(errors and errors[0].startswith("kvd_cpu_bench: "), err)
        self.assertIn("/nonexistent/stories260K.bin", err)


class KvdBenchTest(RefusalMixin, unittest.TestCase):
    program = "kvd bench"

    def test_bad_values_are_usage_errors_before_anything_is_built(self):
        # (flag, value[, what the message names: the preset, for an unknown one])
        for case in [
                ("--steps", "0"), ("--steps", "-5"), ("--warmup", "-3"),
                ("--steps", "2147483648"),
                ("--block-size", "0"), ("--block-size", "3"), ("--block-size", "512"),
                ("--block-size", "4294967312"),  # 2^32 + 16: would wrap to 16 in an int32
                ("--seed", "-1"), ("--seed", "18446744073709551616"),
                ("--threads", "-1"), ("--threads", "4294967297"),
                ("--cases", ","), ("--cases", ""), ("--cases", "1x"), ("--cases", "0x64"),
                ("--cases", "1x99999999999"),
                ("--graphs", "yes"), ("--device", "gpu"),
                ("--model", "/nonexistent/model.bin"), ("--model", "synthetic:nope", "nope")]:
            flag, value, named = case if len(case) == 3 else case + (case[1],)
            with self.subTest(flag=flag, value=value):
                args = list(E2E_TINY)
                if flag in args:
                    i = args.index(flag)
                    del args[i:i + 2]
                self.assert_refused(BENCHES["e2e"], args + [flag, value], flag, named)

    def test_a_case_past_the_models_context_is_a_usage_error(self):
        # synthetic:tiny has 256 positions: 250 + 4 warm-up + 8 steps do not fit.
        args = E2E_TINY[:4] + ["--cases", "1x250", "--warmup", "4", "--steps", "8"]
        self.assert_refused(BENCHES["e2e"], args, "--cases", "1x250")
        # 244 + 4 + 8 fills them exactly: each step computes one position, and runs.
        fits = E2E_TINY[:4] + ["--cases", "1x244", "--warmup", "4", "--steps", "8",
                               "--graphs", "off", "--threads", "1"]
        code, out, err, _ = run(BENCHES["e2e"], fits)
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"(?m)^\s+1\s+244\s+off\s.* ok$")

    def test_help_tells_the_truth(self):
        code, out, err, _ = run(BENCHES["e2e"], ["--help"])
        self.assertEqual(code, 0, err)
        usage = out.split("\n\n")[0]
        self.assertTrue(usage.startswith("usage: kvd bench [--model synthetic:llama3-8b]"), usage)
        self.assertIn("[--device auto]", usage)
        self.assertIn("[--graphs both|on|off]", usage)
        self.assertIn("[--profile]", usage)
        self.assertRegex(out, r"--block-size .*range a power of two in \[1, 256\]")
        self.assertRegex(out, r"--seed .*range \[0, 18446744073709551615\]")
        self.assertRegex(out, r"--steps .*range \[1, 2147483647\]")
        self.assertRegex(out, r"--warmup .*range \[0, 2147483647\]")
        self.assertRegex(out, r"--threads .*range \[0, 1024\]")

    def test_the_largest_seed_runs(self):
        # The control for the refusals above: good flags build the model and print a row.
        code, out, err, _ = run(BENCHES["e2e"], E2E_TINY + ["--seed", "18446744073709551615"])
        self.assertEqual(code, 0, err)
        self.assertIn("kvd end-to-end decode, synthetic:tiny on cpu", out)
        self.assertRegex(out, r"\n\s+1\s+16\s+off .* ok\n")


class GpuBenchTest(RefusalMixin, unittest.TestCase):
    program = "gpu_bench"

    def setUp(self):
        if not BENCHES["gpu"]:
            self.skipTest("no gpu_bench in this build (CUDA off)")

    def test_help_is_not_an_error(self):
        for arg in ["--help", "-h"]:
            code, out, err, _ = run(BENCHES["gpu"], [arg])
            self.assertEqual(code, 0, err)
            self.assertTrue(out.startswith("usage: gpu_bench [gemv|sweep|prefill|decode|paired]"),
                            out)
            self.assertIn("KVD_BENCH_RUNS", out)
            self.assertIn("KVD_DECODE_TRACE", out)

    def test_paired_mode_keeps_stdout_for_its_protocol(self):
        # Without a GPU it says so on stderr and exits 0; stdout, paired_prefill.py's protocol
        # channel, stays empty (on a GPU machine it opens with a shape line, then ends at the
        # end of its input).
        env = dict(os.environ)
        env.pop("OUT", None)
        done = subprocess.run(BENCHES["gpu"] + ["paired"], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, env=env, timeout=300)
        code, out, err = done.returncode, done.stdout, done.stderr
        self.assertEqual(code, 0, err)
        if "no CUDA device" in err:
            self.assertEqual(out, "")
        else:
            self.assertRegex(out, r"^shape \d+ \d+ \d+\n")

    def test_unknown_and_extra_arguments(self):
        self.assert_refused(BENCHES["gpu"], ["bogus"], "mode", "bogus")
        self.assert_refused(BENCHES["gpu"], ["--runs=3"], "mode", "--runs=3")
        self.assert_refused(BENCHES["gpu"], ["decode", "extra"], "argument", "extra")

    def test_malformed_environment(self):
        for env, mode, value in [
                ({"KVD_BENCH_RUNS": "abc"}, [], "abc"),
                ({"KVD_BENCH_RUNS": "0"}, ["decode"], "0"),
                ({"KVD_BENCH_RUNS": "99999999999"}, ["gemv"], "99999999999"),
                ({"KVD_DECODE_TRACE": "0"}, ["decode"], "0"),
                ({"KVD_DECODE_TRACE": "1001"}, [], "1001"),
                ({"KVD_DECODE_TRACE": "some"}, ["decode"], "some"),
                ({"KVD_SWEEP_SHAPE": "3x3"}, ["sweep"], "3x3"),
                ({"KVD_SWEEP_SHAPE": "1x4096x2"}, ["sweep"], "1x4096x2"),
                ({"KVD_SWEEP_ONLY": "x"}, ["sweep"], "x"),
                ({"KVD_SWEEP_ONLY": "99,1"}, ["sweep"], "99,1"),
                ({"KVD_SWEEP_LAYOUTS": "yes"}, ["sweep"], "yes")]:
            name = next(iter(env))
            with self.subTest(env=env):
                self.assert_refused(BENCHES["gpu"], mode, name, value, env=env)


def main():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--cpu-bench", required=True)
    parser.add_argument("--kvd", required=True)
    parser.add_argument("--gpu-bench", default="")  # empty: not built (CUDA off)
    known, rest = parser.parse_known_args()
    BENCHES.update(cpu=[known.cpu_bench], e2e=[known.kvd, "bench"],
                   gpu=[known.gpu_bench] if known.gpu_bench else [])
    program = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    sys.exit(0 if program.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
