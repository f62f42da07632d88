"""scripts/install-deps, which `make serve`, `make test`, `make fuzz` and `make format` call
first: it reads every argument, so modes combine and a bad one anywhere is refused (exit 2,
naming it) before dpkg or apt is asked anything; and each make target asks for its own
mode. Nothing is installed: only refusals run, and the targets are read with `make -n`."""

import os
import shutil
import subprocess
import unittest

import kvd_harness as h

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALL_DEPS = os.path.join(SOURCE_DIR, "scripts", "install-deps")


def install_deps(*args):
    return subprocess.run([INSTALL_DEPS] + list(args), capture_output=True, text=True,
                          timeout=60)


class InstallDepsArgumentsTest(unittest.TestCase):

    def assertRefused(self, args, bad):
        result = install_deps(*args)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("unknown argument '%s'" % bad, result.stderr)
        self.assertIn("[--test] [--fuzz] [--format]", result.stderr)
        self.assertNotIn("installing", result.stdout)

    def test_an_unknown_first_argument_is_refused(self):
        self.assertRefused(["--tests"], "--tests")

    def test_an_unknown_argument_after_a_good_one_is_refused(self):
        self.assertRefused(["--test", "--fuzzz"], "--fuzzz")
        self.assertRefused(["--fuzz", "--format", "extra"], "extra")


@unittest.skipIf(shutil.which("make") is None, "make is not installed")
class MakeTargetsAskForTheirModeTest(unittest.TestCase):

    def recipe(self, target):
        env = {k: v for k, v in os.environ.items()
               if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
        return subprocess.run(["make", "--no-print-directory", "-n", "-C", SOURCE_DIR, target],
                              env=env, check=True, capture_output=True, text=True).stdout

    def test_each_target_installs_what_it_runs(self):
        for target, line in [("test", "scripts/install-deps --test"),
                             ("fuzz", "scripts/install-deps --fuzz"),
                             ("format", "scripts/install-deps --format")]:
            with self.subTest(target=target):
                self.assertIn(line, self.recipe(target).splitlines())


if __name__ == "__main__":
    h.main()
