"""scripts/install-deps, which `make serve`, `make test`, `make fuzz` and `make format` call
first: it reads every argument, so modes combine and a bad one anywhere is refused (exit 2,
naming it) before dpkg or apt is asked anything; and each make target asks for its own
mode. Nothing is installed: only refusals run, and the targets are read with `make -n`.

scripts/fetch-model, which finds `make serve`'s default model: the development copy beside
the checkout first, else its cache, downloading into the cache from a mirror (here a file://
URL, so no network is used) and keeping only files whose sha256 matches."""

import os
import shutil
import subprocess
import tempfile
import unittest

import kvd_harness as h

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALL_DEPS = os.path.join(SOURCE_DIR, "scripts", "install-deps")
FETCH_MODEL = os.path.join(SOURCE_DIR, "scripts", "fetch-model")
MODEL_FILES = ("stories260K.bin", "tok512.bin")


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


@unittest.skipIf(shutil.which("curl") is None, "curl is not installed")
class FetchModelTest(unittest.TestCase):
    """The script runs from a copy in a checkout with no ../shared beside it, so only the
    cache and the mirror can answer."""

    def setUp(self):
        temp = tempfile.TemporaryDirectory()
        self.addCleanup(temp.cleanup)
        self.dir = temp.name
        checkout_scripts = os.path.join(self.dir, "checkout", "scripts")
        os.makedirs(checkout_scripts)
        self.script = shutil.copy(FETCH_MODEL, checkout_scripts)
        self.cache = os.path.join(self.dir, "cache")
        self.mirror = os.path.join(self.dir, "mirror")
        os.makedirs(self.mirror)

    def shared_model(self, name):
        return os.path.join(h.Paths.shared_dir, "models", name)

    def put_in_mirror(self, name, data=None):
        target = os.path.join(self.mirror, name)
        if data is None:
            shutil.copy(self.shared_model(name), target)
        else:
            with open(target, "wb") as f:
                f.write(data)

    def fetch(self):
        env = dict(os.environ, KVD_MODEL_CACHE=self.cache,
                   KVD_MODEL_BASE_URL="file://" + self.mirror)
        return subprocess.run([self.script], env=env, capture_output=True, text=True,
                              timeout=60)

    def cache_entries(self):
        return sorted(os.listdir(self.cache)) if os.path.isdir(self.cache) else []

    def test_the_development_copy_beside_the_checkout_comes_first(self):
        result = subprocess.run([FETCH_MODEL], capture_output=True, text=True, timeout=60,
                                env=dict(os.environ, KVD_MODEL_CACHE=self.cache,
                                         KVD_MODEL_BASE_URL="file://" + self.mirror))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(os.path.realpath(result.stdout.strip()),
                         os.path.realpath(os.path.join(SOURCE_DIR, "..", "shared", "models",
                                                       "stories260K.bin")))
        self.assertEqual(self.cache_entries(), [])

    def test_downloads_both_files_into_the_cache_and_prints_the_checkpoint(self):
        for name in MODEL_FILES:
            self.put_in_mirror(name)
        result = self.fetch()
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, os.path.join(self.cache, "stories260K.bin") + "\n")
        self.assertEqual(self.cache_entries(), sorted(MODEL_FILES))
        for name in MODEL_FILES:
            with open(os.path.join(self.cache, name), "rb") as got, \
                    open(self.shared_model(name), "rb") as want:
                self.assertEqual(got.read(), want.read(), name)
            self.assertIn("downloading file://%s/%s" % (self.mirror, name), result.stderr)

    def test_a_full_cache_is_used_without_the_mirror(self):
        os.makedirs(self.cache)
        for name in MODEL_FILES:
            shutil.copy(self.shared_model(name), self.cache)
        result = self.fetch()  # the mirror is empty
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, os.path.join(self.cache, "stories260K.bin") + "\n")
        self.assertNotIn("downloading", result.stderr)

    def test_a_file_with_the_wrong_sha256_is_refused_and_not_kept(self):
        self.put_in_mirror("stories260K.bin")
        self.put_in_mirror("tok512.bin", b"not a tokenizer")
        result = self.fetch()
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stdout, "")
        self.assertIn("tok512.bin has sha256", result.stderr)
        self.assertIn("expected 037cb335", result.stderr)
        # The good checkpoint is kept; nothing of the bad file, not even its temporary.
        self.assertEqual(self.cache_entries(), ["stories260K.bin"])

    def test_a_missing_file_fails_with_what_to_do_and_leaves_no_partial_file(self):
        self.put_in_mirror("stories260K.bin")
        result = self.fetch()
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stdout, "")
        self.assertIn("could not download file://%s/tok512.bin" % self.mirror, result.stderr)
        self.assertIn("KVD_MODEL_BASE_URL", result.stderr)
        self.assertIn("make serve SERVE_MODEL=PATH", result.stderr)
        self.assertEqual(self.cache_entries(), ["stories260K.bin"])

        # Once the mirror has it, a second run fetches only the missing file.
        self.put_in_mirror("tok512.bin")
        os.remove(os.path.join(self.mirror, "stories260K.bin"))
        result = self.fetch()
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("stories260K.bin ->", result.stderr)
        self.assertEqual(self.cache_entries(), sorted(MODEL_FILES))


if __name__ == "__main__":
    h.main()
