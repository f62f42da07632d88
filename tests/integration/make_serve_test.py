"""`make serve`'s command line: it listens where its config file says unless GRPC_ADDRESS or
METRICS_ADDRESS is given (on the make command line or in the environment), passes those
quoted (METRICS_ADDRESS= is `--metrics-address ""`: metrics off), and the default config
holds the addresses README.md documents.

Reads the recipe with `make -n` (nothing runs) and `-o configure -o deps`, so not even the
package installation is printed; no daemon starts."""

import os
import re
import shutil
import subprocess
import unittest

import kvd_harness as h

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# README.md's Quick start: where `make serve` listens by default.
DOCUMENTED_GRPC_ADDRESS = "127.0.0.1:50051"
DOCUMENTED_METRICS_ADDRESS = "127.0.0.1:50052"


def serve_command(make_args=(), env=None):
    """The `kvd serve` line `make serve` would run, with make_args and extra env."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "BUILD",
                          "SERVE_CONFIG", "GRPC_ADDRESS", "METRICS_ADDRESS")}
    clean.update(env or {})
    out = subprocess.run(["make", "--no-print-directory", "-n", "-o", "configure", "-o", "deps",
                          "-C", SOURCE_DIR, "serve"] + list(make_args),
                         env=clean, check=True, capture_output=True, text=True).stdout
    lines = [line for line in out.splitlines() if " serve --config " in line]
    if len(lines) != 1:
        raise AssertionError("expected one `kvd serve` line in `make -n serve`:\n" + out)
    # The whole recipe must still be valid shell.
    subprocess.run(["sh", "-n"], input=out, check=True, text=True)
    return lines[0]


@unittest.skipIf(shutil.which("make") is None, "make is not installed")
class MakeServeTest(unittest.TestCase):

    def test_default_uses_the_config_files_addresses(self):
        line = serve_command()
        self.assertIn('--config "config/serve.yaml"', line)
        self.assertNotIn("--grpc-address", line)
        self.assertNotIn("--metrics-address", line)

    def test_another_config_keeps_its_addresses(self):
        line = serve_command(["SERVE_CONFIG=/tmp/kvd x.yaml"])
        self.assertIn('--config "/tmp/kvd x.yaml"', line)
        self.assertNotIn("--grpc-address", line)
        self.assertNotIn("--metrics-address", line)

    def test_empty_metrics_address_turns_metrics_off(self):
        line = serve_command(["METRICS_ADDRESS="])
        self.assertRegex(line, r'--metrics-address ""\s*$')
        self.assertNotIn("--grpc-address", line)

    def test_addresses_given_on_the_command_line_or_in_the_environment(self):
        line = serve_command(["GRPC_ADDRESS=[::]:50052"], env={"METRICS_ADDRESS": "0.0.0.0:9401"})
        self.assertIn('--grpc-address "[::]:50052"', line)
        self.assertIn('--metrics-address "0.0.0.0:9401"', line)

    def test_default_config_holds_the_documented_addresses(self):
        with open(os.path.join(SOURCE_DIR, "config", "serve.yaml")) as f:
            config = f.read()
        self.assertRegex(config, r"(?m)^  grpc_address: %s$" % re.escape(DOCUMENTED_GRPC_ADDRESS))
        self.assertRegex(config,
                         r"(?m)^  metrics_address: %s$" % re.escape(DOCUMENTED_METRICS_ADDRESS))
        with open(os.path.join(SOURCE_DIR, "README.md")) as f:
            readme = f.read()
        self.assertIn("`%s`" % DOCUMENTED_GRPC_ADDRESS, readme)
        self.assertIn("`http://%s/metrics`" % DOCUMENTED_METRICS_ADDRESS, readme)


if __name__ == "__main__":
    h.main()
