#!/usr/bin/env python3
"""Specification of tests/gpu/run.sh's verdict on gpu_test, with a stand-in gpu_test (no GPU
needed): a run whose tests were all skipped (they skip where no GPU is visible) tested
nothing and fails; a run with a test that ran passes."""
import json
import os
import stat
import subprocess
import tempfile
import unittest

RUN_SH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.sh")

# A gpu_test that writes the gtest JSON report it is given and exits 0.
FAKE_GPU_TEST = """#!/usr/bin/env python3
import sys
for arg in sys.argv[1:]:
    if arg.startswith("--gtest_output=json:"):
        with open(arg[len("--gtest_output=json:"):], "w") as f:
            f.write({report!r})
"""


def report(results):
    return json.dumps({"tests": len(results), "testsuites": [{"name": "GpuVsCpuTest", "testsuite": [
        {"name": "Case%d" % i, "status": "RUN", "result": r} for i, r in enumerate(results)]}]})


def run_with(results):
    with tempfile.TemporaryDirectory() as build:
        os.makedirs(os.path.join(build, "tests", "gpu"))
        fake = os.path.join(build, "tests", "gpu", "gpu_test")
        with open(fake, "w") as f:
            f.write(FAKE_GPU_TEST.format(report=report(results)))
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)
        env = dict(os.environ, BUILD=build, OUT=os.path.join(build, "out"), RUN_BENCH="0",
                   RUN_ENGINE="0", RUN_SERVE="0", RUN_PEERS="0")
        done = subprocess.run(["bash", RUN_SH], env=env, capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr


class AllSkippedTest(unittest.TestCase):
    def test_every_test_skipped_fails_the_run(self):
        code, out = run_with(["SKIPPED", "SKIPPED"])
        self.assertNotEqual(code, 0, out)
        self.assertIn("gpu_test: every test was skipped", out)

    def test_a_test_that_ran_passes(self):
        code, out = run_with(["COMPLETED", "SKIPPED"])
        self.assertEqual(code, 0, out)
        self.assertNotIn("every test was skipped", out)


if __name__ == "__main__":
    unittest.main()
