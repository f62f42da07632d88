"""Config files at startup: bad ones stop `kvd serve` with exit 1 and a message naming the
key and value; the seeds' example, config/serve.yaml (`make serve`) and the ConfigMap in
deploy/kvd.yaml start a daemon that serves."""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import unittest

import grpc

import kvd_harness as h

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


SEED_YAML = """\
model:
  path: {model}
kv_cache_config:
  max_batch_size: 8
  max_seq_length: 4096
  quantization: {quantization}
  memory_pool:
    initial_size: 16GB
    max_size: 32GB
  eviction_policy: lru
"""


class BadConfigTest(unittest.TestCase):
    """Each bad config: `kvd serve` exits 1 (2 for bad flags) with one message naming the key
    and the value."""

    def assertStartupFails(self, config_yaml, args, key_regex, rc=1, with_model=True):
        model_args = ["--model", h.Paths.model()] if with_model else []
        code, out, err = h.run_kvd_serve(model_args + args, config_yaml)
        self.assertEqual(code, rc, "stdout:\n%s\nstderr:\n%s" % (out, err))
        self.assertRegex(err, key_regex)
        self.assertNotIn("serving gRPC", out)

    def test_unknown_key(self):
        self.assertStartupFails("kv_cache_config:\n  blok_size: 16\n", [],
                                r"kv_cache_config\.blok_size")

    def test_unknown_section(self):
        self.assertStartupFails("servr:\n  drain_timeout: 1s\n", [], r"servr")

    def test_bad_byte_size(self):
        self.assertStartupFails(
            "kv_cache_config:\n  memory_pool:\n    initial_size: 16XB\n", [],
            r"kv_cache_config\.memory_pool\.initial_size.*16XB")

    def test_bad_enum(self):
        self.assertStartupFails("kv_cache_config:\n  quantization: int9\n", [],
                                r"kv_cache_config\.quantization.*int9")

    def test_initial_size_above_max_size(self):
        self.assertStartupFails(
            "kv_cache_config:\n  memory_pool:\n    initial_size: 2GB\n    max_size: 1GB\n", [],
            r"initial_size")

    def test_bad_duration(self):
        self.assertStartupFails("server:\n  drain_timeout: soon\n", [],
                                r"server\.drain_timeout.*soon")

    def test_invalid_yaml(self):
        self.assertStartupFails("kv_cache_config: [1, 2\n", [], r"(?i)yaml")

    def test_bad_override(self):
        self.assertStartupFails(None, ["--set", "kv_cache_config.block_size=3"],
                                r"kv_cache_config\.block_size.*3")

    def test_unknown_override_key(self):
        self.assertStartupFails(None, ["--set", "scheduler.nope=1"], r"scheduler\.nope")

    def test_missing_model(self):
        self.assertStartupFails(None, ["--model", "/nonexistent/model.bin"],
                                r"model\.path.*/nonexistent/model\.bin", with_model=False)

    def test_model_without_tokenizer(self):
        # A model file in an empty folder: no tok512.bin / tokenizer.bin beside it.
        with tempfile.TemporaryDirectory(prefix="kvd_model_") as d:
            model = os.path.join(d, "stories260K.bin")
            os.symlink(h.Paths.model(), model)
            self.assertStartupFails(None, ["--model", model], r"model\.tokenizer",
                                    with_model=False)

    def test_missing_config_file(self):
        code, _, err = h.run_kvd_serve(["--config", "/nonexistent/kvd.yaml"])
        self.assertEqual(code, 1, err)
        self.assertIn("/nonexistent/kvd.yaml", err)

    def test_unknown_flag(self):
        code, _, err = h.run_kvd_serve(["--no-such-flag"])
        self.assertEqual(code, 2, err)
        self.assertIn("no-such-flag", err)

    def test_seed_config_with_int4_is_refused_with_a_clear_message(self):
        yaml = SEED_YAML.format(model=h.Paths.model(), quantization="int4")
        code, out, err = h.run_kvd_serve([], yaml)
        self.assertEqual(code, 1, "stdout:\n%s\nstderr:\n%s" % (out, err))
        self.assertRegex(err, r"kv_cache_config\.quantization.*int4")
        self.assertIn("none, int8", err)  # says what this build supports


class AddressInUseTest(unittest.TestCase):
    """A second daemon on a running one's gRPC port fails at startup naming the address (gRPC
    would otherwise share the port through SO_REUSEPORT and split the clients between the
    two); the first keeps serving."""

    def test_grpc_port_of_a_running_daemon(self):
        first = h.Daemon(title="kvd (first)")
        self.addCleanup(first.kill)
        code, out, err = h.run_kvd_serve(["--model", h.Paths.model(), "--grpc-address",
                                          first.grpc_address, "--set", "server.num_threads=1"])
        self.assertEqual(code, 1, "stdout:\n%s\nstderr:\n%s" % (out, err))
        self.assertRegex(err, r"server\.grpc_address.*%s.*in use" % re.escape(first.grpc_address))
        self.assertNotIn("serving gRPC", out)
        case = h.load_golden()[0]
        tokens, _, _ = first.generate(h.greedy_request(case, max_tokens=8))
        self.assertEqual(tokens, case["output_tokens"][:8])
        self.assertEqual(first.stop(), 0, first.process.output())


class UnixSocketInUseTest(unittest.TestCase):
    """gRPC on a unix socket: a second daemon on a running one's socket fails at startup and
    leaves it alone (gRPC would delete the socket and take the path over, and the first
    daemon, still running, could no longer be reached); a socket left by a run that died is
    replaced."""

    def start(self, path, title):
        proc = h.Process(title, [h.Paths.kvd, "serve", "--model", h.Paths.model(),
                                 "--grpc-address", "unix:" + path,
                                 "--metrics-address", "127.0.0.1:0",
                                 "--set", "server.num_threads=1"])
        self.addCleanup(proc.close)
        proc.wait_for_line(r"^kvd: serving gRPC on unix:%s" % re.escape(path),
                           h.STARTUP_TIMEOUT_S)
        return proc

    def generate(self, path, case):
        with grpc.insecure_channel("unix:" + path) as channel:
            stub = h.pb_grpc().InferenceStub(channel)
            tokens = []
            for r in stub.Generate(h.greedy_request(case, max_tokens=8),
                                   timeout=h.RPC_TIMEOUT_S):
                tokens += r.token_ids
            return tokens

    def test_the_socket_of_a_running_daemon(self):
        with tempfile.TemporaryDirectory(prefix="kvd_sock_") as d:
            path = os.path.join(d, "grpc.sock")
            first = self.start(path, "kvd (first)")
            inode = os.stat(path).st_ino
            code, out, err = h.run_kvd_serve(["--model", h.Paths.model(),
                                              "--grpc-address", "unix:" + path])
            self.assertEqual(code, 1, "stdout:\n%s\nstderr:\n%s" % (out, err))
            self.assertRegex(err, r"server\.grpc_address.*%s.*in use" % re.escape(path))
            self.assertEqual(os.stat(path).st_ino, inode)
            case = h.load_golden()[0]
            self.assertEqual(self.generate(path, case), case["output_tokens"][:8])
            first.proc.terminate()
            self.assertEqual(first.wait(), 0, first.output())

    def test_a_stale_socket_is_replaced(self):
        with tempfile.TemporaryDirectory(prefix="kvd_sock_") as d:
            path = os.path.join(d, "grpc.sock")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.bind(path)  # bound, never listening: what a killed daemon leaves
            daemon = self.start(path, "kvd (over a stale socket)")
            case = h.load_golden()[0]
            self.assertEqual(self.generate(path, case), case["output_tokens"][:8])
            daemon.proc.terminate()
            self.assertEqual(daemon.wait(), 0, daemon.output())


class SeedConfigTest(unittest.TestCase):
    """The seeds' YAML with quantization none (16GB/32GB pool) starts and serves; the pool is
    committed lazily, so the process stays small."""

    def test_seed_config_with_none_serves(self):
        yaml = SEED_YAML.format(model=h.Paths.model(), quantization="none")
        daemon = h.Daemon(config_yaml=yaml, model=None, title="kvd (seed config)")
        self.addCleanup(daemon.kill)
        case = h.load_golden()[0]
        tokens, _, _ = daemon.generate(h.greedy_request(case))
        self.assertEqual(tokens, case["output_tokens"])
        stats = daemon.cache_stats()
        self.assertLessEqual(stats.max_bytes, 32 * 10**9)
        self.assertGreater(stats.max_bytes, 31 * 10**9)
        with open("/proc/%d/status" % daemon.pid) as f:
            rss_kib = int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1))
        self.assertLess(rss_kib, 2 * 1024 * 1024, "16GB pool was committed eagerly")
        self.assertEqual(daemon.stop(), 0)


class SeedConfigInt8Test(unittest.TestCase):
    """The seeds' YAML as given (quantization int8) serves on the CPU: the pool stores int8
    blocks (with their scales: 7,680 bytes for stories260K, 20,480 in f32), GetModelInfo and
    the metrics say so, and greedy outputs begin as llama2.c's fp32 ones (the int8 cache
    changes a next-token choice rarely: tests/model/kv_quantization_test.cc)."""

    def test_seed_config_with_int8_serves_int8_blocks(self):
        yaml = SEED_YAML.format(model=h.Paths.model(), quantization="int8")
        daemon = h.Daemon(config_yaml=yaml, model=None, title="kvd (seed config, int8)")
        self.addCleanup(daemon.kill)
        info = daemon.stub.GetModelInfo(h.pb().GetModelInfoRequest(), timeout=h.RPC_TIMEOUT_S)
        self.assertEqual(info.kv_dtype, "int8")
        self.assertRegex(daemon.metrics_text(), r'kvd_cache_config_info\{[^}]*kv_dtype="int8"')
        for case in h.load_golden()[:3]:
            tokens, _, _ = daemon.generate(h.greedy_request(case))
            self.assertEqual(tokens[:8], case["output_tokens"][:8])
        stats = daemon.idle_stats()
        self.assertEqual(stats.block_bytes, 7680)
        self.assertGreater(stats.cached_blocks, 0)
        self.assertEqual(daemon.stop(), 0)


class ShippedConfigTest(unittest.TestCase):
    """The config files in the repository start a daemon that serves (addresses and model
    overridden by flags, which win over the file)."""

    def assertServes(self, config_yaml, title):
        daemon = h.Daemon(config_yaml=config_yaml, title=title)
        self.addCleanup(daemon.kill)
        case = h.load_golden()[2]
        tokens, _, last = daemon.generate(h.greedy_request(case))
        self.assertEqual(tokens, case["output_tokens"])
        self.assertEqual(last.finish_reason, h.expected_finish_reason(case))
        self.assertEqual(daemon.stop(), 0, daemon.process.output())

    def test_make_serve_config(self):
        with open(os.path.join(SOURCE_DIR, "config", "serve.yaml")) as f:
            self.assertServes(f.read(), "kvd (config/serve.yaml)")

    def test_inference_config_with_every_key(self):
        with open(os.path.join(SOURCE_DIR, "config", "inference_config.yaml")) as f:
            self.assertServes(f.read(), "kvd (config/inference_config.yaml)")

    def test_kubernetes_configmap(self):
        with open(os.path.join(SOURCE_DIR, "deploy", "kvd.yaml")) as f:
            text = f.read()
        # The ConfigMap's block scalar: the lines indented under `inference_config.yaml: |`.
        m = re.search(r"(?m)^  inference_config\.yaml: \|\n((?:    .*\n|\s*\n)+)", text)
        self.assertIsNotNone(m, "no inference_config.yaml in deploy/kvd.yaml's ConfigMap")
        yaml = "\n".join(line[4:] for line in m.group(1).splitlines())
        self.assertIn("kv_cache_config:", yaml)
        self.assertServes(yaml, "kvd (deploy/kvd.yaml ConfigMap)")

    def test_kubernetes_grace_period_outlasts_the_longest_clean_exit(self):
        """The kubelet's SIGKILL must not come before kvd's clean exit: the preStop sleep, the
        ConfigMap's drain_timeout, then serve's two shutdown waits (final messages, then the
        gRPC server's close; kShutdownGrace each), with a few seconds left for the last
        engine step."""
        with open(os.path.join(SOURCE_DIR, "deploy", "kvd.yaml")) as f:
            text = f.read()
        with open(os.path.join(SOURCE_DIR, "server", "serve_command.cc")) as f:
            serve = f.read()

        def seconds(pattern, source, what):
            m = re.search(pattern, source)
            self.assertIsNotNone(m, "no %s found" % what)
            return int(m.group(1))

        grace = seconds(r"terminationGracePeriodSeconds: (\d+)", text, "grace period")
        pre_stop = seconds(r'preStop:\s+exec:\s+command: \["sleep", "(\d+)"\]', text,
                           "preStop sleep")
        drain = seconds(r"\n    server:\n(?:      .*\n)*?      drain_timeout: (\d+)s\n", text,
                        "ConfigMap drain_timeout")
        shutdown = seconds(r"kShutdownGrace = absl::Seconds\((\d+)\)", serve, "kShutdownGrace")
        self.assertGreaterEqual(grace, pre_stop + drain + 2 * shutdown + 5,
                                "preStop %d s + drain %d s + 2 x %d s shutdown + 5 s" %
                                (pre_stop, drain, shutdown))


class ShippedPortsTest(unittest.TestCase):
    """Every shipped file that names kvd's ports names the defaults (config/inference_config.h):
    the example config, the Dockerfile, the Kubernetes manifest and its README, and `make
    serve`'s config with what documents it."""

    def read(self, *path):
        with open(os.path.join(SOURCE_DIR, *path)) as f:
            return f.read()

    def default_port(self, key):
        m = re.search(r'std::string %s = "[^"]*:(\d+)";' % key,
                      self.read("config", "inference_config.h"))
        self.assertIsNotNone(m, "no default %s in config/inference_config.h" % key)
        return m.group(1)

    def assertPorts(self, text, where, patterns, port):
        for pattern in patterns:
            found = re.findall(pattern, text)
            self.assertTrue(found, "%s: nothing matches %r" % (where, pattern))
            for value in found:
                self.assertEqual(value, port, "%s: %r gives %s, not %s" %
                                 (where, pattern, value, port))

    def test_the_files_agree_with_the_defaults(self):
        grpc_port = self.default_port("grpc_address")
        metrics = self.default_port("metrics_address")
        self.assertPorts(self.read("config", "inference_config.yaml"), "inference_config.yaml",
                         [r"metrics_address: 0\.0\.0\.0:(\d+)"], metrics)
        self.assertPorts(self.read("config", "inference_config.yaml"), "inference_config.yaml",
                         [r"grpc_address: 0\.0\.0\.0:(\d+)"], grpc_port)
        dockerfile = self.read("Dockerfile")
        self.assertPorts(dockerfile, "Dockerfile",
                         [r"EXPOSE \d+ (\d+)", r'"--metrics-address", "0\.0\.0\.0:(\d+)"',
                          r"-p (\d+):\d+ kvd:latest", r"0\.0\.0\.0:\d+ and 0\.0\.0\.0:(\d+)"], metrics)
        self.assertPorts(dockerfile, "Dockerfile",
                         [r"EXPOSE (\d+) \d+", r'"--grpc-address", "0\.0\.0\.0:(\d+)"'], grpc_port)
        manifest = self.read("deploy", "kvd.yaml")
        self.assertPorts(manifest, "deploy/kvd.yaml",
                         [r"metrics_address: 0\.0\.0\.0:(\d+)", r'prometheus\.io/port: "(\d+)"',
                          r"name: metrics\n\s+containerPort: (\d+)",
                          r"name: metrics\n\s+port: (\d+)"], metrics)
        self.assertPorts(manifest, "deploy/kvd.yaml",
                         [r"grpc_address: 0\.0\.0\.0:(\d+)", r"name: grpc\n\s+containerPort: (\d+)",
                          r"name: grpc\n\s+port: (\d+)"], grpc_port)
        self.assertPorts(self.read("deploy", "README.md"), "deploy/README.md",
                         [r"-p \d+:\d+ -p (\d+):\d+", r"-p \d+:\d+ -p \d+:(\d+)",
                          r"\(metrics `:(\d+)`\)", r"port-forward svc/kvd \S+ (\d+):",
                          r"curl -s 127\.0\.0\.1:(\d+)/metrics", r"`metrics` (\d+)"], metrics)

    def test_make_serves_metrics_address_is_documented_where_it_is_scraped(self):
        m = re.search(r"metrics_address: 127\.0\.0\.1:(\d+)", self.read("config", "serve.yaml"))
        self.assertIsNotNone(m, "no metrics_address in config/serve.yaml")
        port = m.group(1)
        self.assertPorts(self.read("README.md"), "README.md",
                         [r"`http://127\.0\.0\.1:(\d+)/metrics`"], port)
        self.assertPorts(self.read("deploy", "prometheus.yml"), "deploy/prometheus.yml",
                         [r'targets: \["127\.0\.0\.1:(\d+)"\]'], port)
        self.assertPorts(self.read("Makefile"), "Makefile", [r"metrics 127\.0\.0\.1:(\d+)"], port)


class DockerfileRuntimeTest(unittest.TestCase):
    """The Dockerfile's runtime stage installs the Debian package of every shared library the
    kvd binary links (ldd, then dpkg -S), so that a new dependency shows here rather than as a
    missing library at `docker run` (no Docker here or in CI to build the image)."""

    # In debian:12-slim already; the sanitizer runtimes link only into test-sanitize's build.
    BASE = {"libc6", "libgcc-s1", "libstdc++6"}
    SANITIZER = re.compile(r"^lib(asan|ubsan)\d*$")

    def linked_packages(self):
        ldd = subprocess.run(["ldd", h.Paths.kvd], capture_output=True, text=True, check=True)
        paths = re.findall(r"=> (/\S+)", ldd.stdout)
        # One dpkg-query for all (it exits non-zero when some path has no owner): each line
        # is "package[:arch]: path".
        query = subprocess.run(["dpkg-query", "-S"] + sorted(
            {p for path in paths for p in (path, os.path.realpath(path))}),
            capture_output=True, text=True)
        owners = {}
        for line in query.stdout.splitlines():
            package, _, owned = line.partition(": ")
            owners[owned] = package.split(":")[0]
        packages = set()
        for path in paths:
            owner = owners.get(os.path.realpath(path), owners.get(path))
            if owner is None and path.startswith("/usr/local/"):
                continue  # a CUDA toolkit library: the image is built without CUDA
            self.assertIsNotNone(owner, "no Debian package owns %s" % path)
            packages.add(owner)
        return packages

    def test_the_runtime_stage_installs_every_library_kvd_links(self):
        if shutil.which("dpkg-query") is None or shutil.which("ldd") is None:
            self.skipTest("needs dpkg-query and ldd (Debian)")
        with open(os.path.join(SOURCE_DIR, "Dockerfile")) as f:
            dockerfile = f.read()
        runtime = dockerfile[dockerfile.index("FROM debian:12-slim"):]
        m = re.search(r"apt-get install -y --no-install-recommends([^&]*)&&", runtime)
        self.assertIsNotNone(m, "no apt-get install in the Dockerfile's runtime stage")
        installed = set(m.group(1).replace("\\", " ").split())
        needed = {p for p in self.linked_packages()
                  if p not in self.BASE and not self.SANITIZER.match(p)}
        self.assertTrue(needed, "ldd found no library at all")
        self.assertEqual(needed - installed, set(),
                         "the Dockerfile's runtime stage lacks these packages")


if __name__ == "__main__":
    h.main()
