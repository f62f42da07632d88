"""Shared helpers for kvd's integration tests: start the real daemon, talk gRPC to it.

Every test file runs as its own program (one ctest test each):

    /usr/bin/python3 tests/integration/golden_test.py \
        --kvd build/server/kvd --proto-dir proto --shared-dir ../shared [unittest args]

The flags may also come from the environment (KVD_BINARY, KVD_PROTO_DIR, KVD_SHARED_DIR).
Client stubs are generated at test time from proto/kvd/v1/kvd.proto with grpc_tools.protoc;
grpc.health.v1 and server reflection are called through small protos written here (Debian
ships no Python package for them), which only need to be wire-compatible.

Nothing here is global state of the daemon: each Daemon owns one `kvd serve` process on free
ports, its captured stdout/stderr, and kills it if a test leaves it running. When a test
fails, the captured output of every daemon started by that program is printed.
"""

import argparse
import importlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import grpc

# How long any single wait may take before the test fails instead of hanging. Sanitizer
# builds are several times slower, so every wait scales with KVD_TEST_TIME_SCALE.
TIME_SCALE = float(os.environ.get("KVD_TEST_TIME_SCALE", "1"))
STARTUP_TIMEOUT_S = 60 * TIME_SCALE
RPC_TIMEOUT_S = 120 * TIME_SCALE
EXIT_TIMEOUT_S = 60 * TIME_SCALE

BOS_TOKEN_ID = 1  # llama2.c models end a story with BOS (run.c stops there)

_HEALTH_PROTO = """
syntax = "proto3";
package grpc.health.v1;
message HealthCheckRequest { string service = 1; }
message HealthCheckResponse {
  enum ServingStatus { UNKNOWN = 0; SERVING = 1; NOT_SERVING = 2; SERVICE_UNKNOWN = 3; }
  ServingStatus status = 1;
}
"""

# The subset of grpc.reflection.v1alpha (and v1, which has the same wire format) that the
# tests use. Unknown fields in the answers are skipped by the parser.
_REFLECTION_PROTO = """
syntax = "proto3";
package kvdtest.reflection;
message ServerReflectionRequest {
  string host = 1;
  oneof message_request {
    string file_by_filename = 3;
    string file_containing_symbol = 4;
    string list_services = 7;
  }
}
message FileDescriptorResponse { repeated bytes file_descriptor_proto = 1; }
message ServiceResponse { string name = 1; }
message ListServiceResponse { repeated ServiceResponse service = 1; }
message ErrorResponse { int32 error_code = 1; string error_message = 2; }
message ServerReflectionResponse {
  string valid_host = 1;
  oneof message_response {
    FileDescriptorResponse file_descriptor_response = 4;
    ListServiceResponse list_services_response = 6;
    ErrorResponse error_response = 7;
  }
}
"""


class Paths:
    """Where the binary, the proto and the shared models are (from flags or environment)."""

    kvd = os.environ.get("KVD_BINARY", "")
    proto_dir = os.environ.get("KVD_PROTO_DIR", "")
    shared_dir = os.environ.get("KVD_SHARED_DIR", "")

    @classmethod
    def model(cls):
        return os.path.join(cls.shared_dir, "models", "stories260K.bin")

    @classmethod
    def gguf_model(cls):
        """The same model as GGUF, its tokenizer inside."""
        return os.path.join(cls.shared_dir, "models", "stories260K.gguf")

    @classmethod
    def golden_file(cls):
        return os.path.join(cls.shared_dir, "models", "golden", "stories260K_greedy.jsonl")


def load_golden():
    """The golden cases: prompt_tokens, max_new_tokens, output_tokens, stop ("length"/"bos")."""
    with open(Paths.golden_file()) as f:
        return [json.loads(line) for line in f if line.strip()]


def expected_finish_reason(case):
    return "stop" if case["stop"] == "bos" else "length"


# ---------------------------------------------------------------------------------------------
# Generated client code.


class _Stubs:
    """Lazily generated Python modules: kvd_pb2, kvd_pb2_grpc, health_pb2, reflection_pb2."""

    _lock = threading.Lock()
    _modules = None
    _dir = None

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._modules is None:
                cls._modules = cls._generate()
            return cls._modules

    @classmethod
    def _generate(cls):
        cls._dir = tempfile.TemporaryDirectory(prefix="kvd_stubs_")
        out = cls._dir.name
        extra = os.path.join(out, "extra_protos")
        os.makedirs(os.path.join(extra, "kvdtest"))
        with open(os.path.join(extra, "kvdtest", "health.proto"), "w") as f:
            f.write(_HEALTH_PROTO)
        with open(os.path.join(extra, "kvdtest", "reflection.proto"), "w") as f:
            f.write(_REFLECTION_PROTO)
        runs = [
            ["-I" + Paths.proto_dir, "--grpc_python_out=" + out, "kvd/v1/kvd.proto"],
            ["-I" + extra, "kvdtest/health.proto", "kvdtest/reflection.proto"],
        ]
        for args in runs:
            cmd = [sys.executable, "-m", "grpc_tools.protoc", "--python_out=" + out] + args
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError("protoc failed: %s\n%s" % (" ".join(cmd), proc.stderr))
        sys.path.insert(0, out)
        return {
            "kvd_pb2": importlib.import_module("kvd.v1.kvd_pb2"),
            "kvd_pb2_grpc": importlib.import_module("kvd.v1.kvd_pb2_grpc"),
            "health_pb2": importlib.import_module("kvdtest.health_pb2"),
            "reflection_pb2": importlib.import_module("kvdtest.reflection_pb2"),
        }


def pb():
    """The generated kvd.v1 message module."""
    return _Stubs.get()["kvd_pb2"]


def pb_grpc():
    """The generated kvd.v1 service (stub) module."""
    return _Stubs.get()["kvd_pb2_grpc"]


def health_pb():
    return _Stubs.get()["health_pb2"]


def reflection_pb():
    return _Stubs.get()["reflection_pb2"]


# ---------------------------------------------------------------------------------------------
# Hand-encoded protobuf wire format, for requests protobuf-python refuses to build (a proto3
# string field holding bytes that are not UTF-8).


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def wire_varint(field, value):
    return _varint(field << 3 | 0) + _varint(value)


def wire_bytes(field, data):
    return _varint(field << 3 | 2) + _varint(len(data)) + data


# ---------------------------------------------------------------------------------------------
# The daemon.


def free_port():
    """A TCP port nothing listens on right now (for servers that cannot be given port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_all_logs = []  # (title, path) of every process started by this program, printed on failure


class Process:
    """A child process whose stdout lines are collected by a thread and whose stderr goes to
    a file. kill() is safe to call more than once."""

    def __init__(self, title, argv, cwd=None):
        self.title = title
        self.argv = argv
        self._dir = tempfile.TemporaryDirectory(prefix="kvd_proc_")
        self.stderr_path = os.path.join(self._dir.name, "stderr.txt")
        self._stderr = open(self.stderr_path, "wb")
        self.lines = []  # stdout lines so far
        self._line_queue = queue.Queue()  # stdout lines, then None at the end
        self._stdout_closed = False  # the None has been taken from the queue
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._stderr,
                                     stdin=subprocess.DEVNULL, cwd=cwd)
        _all_logs.append(self)
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()

    def _read_stdout(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            self._line_queue.put(line)
        self._line_queue.put(None)

    def wait_for_line(self, pattern, timeout_s):
        """The first match of `pattern` in a stdout line; fails if the process exits first."""
        deadline = time.monotonic() + timeout_s
        regex = re.compile(pattern)
        for line in list(self.lines):
            m = regex.search(line)
            if m:
                return m
        while True:
            if self._stdout_closed:
                self.proc.wait(timeout=EXIT_TIMEOUT_S)
                raise AssertionError("%s exited (rc %s) before printing %r\n%s" %
                                     (self.title, self.proc.returncode, pattern, self.output()))
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("%s: no stdout line matching %r within %.0fs\n%s" %
                                     (self.title, pattern, timeout_s, self.output()))
            try:
                line = self._line_queue.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                self._stdout_closed = True
                continue
            m = regex.search(line)
            if m:
                return m

    def stderr_text(self):
        if self._stderr.closed:  # close() ran: the file is gone with the case
            return "(not kept: the case closed it)"
        self._stderr.flush()
        with open(self.stderr_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def output(self):
        return "---- %s stdout ----\n%s\n---- %s stderr ----\n%s" % (
            self.title, "\n".join(self.lines), self.title, self.stderr_text())

    def wait(self, timeout_s=EXIT_TIMEOUT_S):
        """The exit code, once `lines` holds every stdout line (the reader thread may still be
        taking the last ones from the pipe when the process has exited); kills the process and
        fails if it does not exit in time."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("%s did not exit within %.0fs\n%s" %
                                 (self.title, timeout_s, self.output()))
        self._reader.join(timeout=EXIT_TIMEOUT_S)
        return code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=EXIT_TIMEOUT_S)

    def close(self):
        """Kills the process and deletes its captured output."""
        self.kill()
        self._stderr.close()
        self._dir.cleanup()


def run_kvd_serve(args, config_yaml=None, timeout_s=STARTUP_TIMEOUT_S):
    """Runs `kvd serve` expecting it to fail at startup: (returncode, stdout, stderr)."""
    with tempfile.TemporaryDirectory(prefix="kvd_cfg_") as d:
        argv = [Paths.kvd, "serve"]
        # Free ports unless the case names its own (kvd refuses a flag given twice).
        for flag in ("--grpc-address", "--metrics-address"):
            if not any(a == flag or a.startswith(flag + "=") for a in args):
                argv += [flag, "127.0.0.1:0"]
        if config_yaml is not None:
            path = os.path.join(d, "config.yaml")
            with open(path, "w") as f:
                f.write(config_yaml)
            argv += ["--config", path]
        proc = subprocess.Popen(argv + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # It started serving instead of failing: stop it and report what it said.
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
            raise AssertionError("kvd serve %s did not fail at startup\n%s\n%s" %
                                 (args, out.decode(errors="replace"),
                                  err.decode(errors="replace")))
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


class Daemon:
    """One `kvd serve` on free ports (gRPC and metrics on 127.0.0.1, port 0).

    `settings` are `--set key=value` overrides; `config_yaml`, when given, is written to a
    temp file and passed with --config. The model is stories260K from the shared dir unless
    `model` is given (None = pass no --model at all).
    """

    def __init__(self, settings=None, config_yaml=None, model="default", title="kvd"):
        self._dir = tempfile.TemporaryDirectory(prefix="kvd_daemon_")
        argv = [Paths.kvd, "serve", "--grpc-address", "127.0.0.1:0", "--metrics-address",
                "127.0.0.1:0"]
        if config_yaml is not None:
            path = os.path.join(self._dir.name, "config.yaml")
            with open(path, "w") as f:
                f.write(config_yaml)
            argv += ["--config", path]
        if model == "default":
            model = Paths.model()
        if model is not None:
            argv += ["--model", model]
        # Two CPU threads by default: the suite shares a small machine with itself.
        all_settings = {"server.num_threads": "2"}
        all_settings.update(settings or {})
        for key, value in all_settings.items():
            argv += ["--set", "%s=%s" % (key, value)]
        self.process = Process(title, argv)
        self.grpc_address = self.process.wait_for_line(
            r"^kvd: serving gRPC on (\S+)$", STARTUP_TIMEOUT_S).group(1)
        m = self.process.wait_for_line(r"^kvd: serving metrics on (http://\S+)/metrics$",
                                       STARTUP_TIMEOUT_S)
        self.metrics_url = m.group(1) + "/metrics"
        self.metrics_host_port = m.group(1)[len("http://"):]
        self.channel = grpc.insecure_channel(self.grpc_address)
        grpc.channel_ready_future(self.channel).result(timeout=STARTUP_TIMEOUT_S)
        self.stub = pb_grpc().InferenceStub(self.channel)

    @property
    def pid(self):
        return self.process.proc.pid

    def alive(self):
        return self.process.proc.poll() is None

    # -- calls ---------------------------------------------------------------------------

    def generate(self, request, timeout_s=RPC_TIMEOUT_S):
        """Runs one stream to its end: (token ids, text, last message)."""
        tokens, text, last = [], [], None
        for r in self.stub.Generate(request, timeout=timeout_s):
            tokens.extend(r.token_ids)
            text.append(r.text)
            last = r
        if last is None or not last.finish_reason:
            raise AssertionError("stream ended without a finish_reason: %r" % last)
        return tokens, "".join(text), last

    def health(self, service=""):
        """grpc.health.v1 Check of `service` ("" = the whole server): the serving status (a
        HealthCheckResponse.ServingStatus); grpc.RpcError as the server answers otherwise."""
        check = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb().HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb().HealthCheckResponse.FromString)
        return check(health_pb().HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S).status

    def cache_stats(self):
        return self.stub.GetCacheStats(pb().GetCacheStatsRequest(), timeout=RPC_TIMEOUT_S)

    def wait_stats(self, predicate, timeout_s, what):
        """Polls GetCacheStats until predicate(stats) holds; the last stats on success."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.cache_stats()
            if predicate(stats):
                return stats
            if time.monotonic() > deadline:
                raise AssertionError("timed out after %.1fs waiting for %s; last stats:\n%s" %
                                     (timeout_s, what, stats))
            time.sleep(0.05)

    def idle_stats(self):
        """GetCacheStats once no request runs. A stream's final message can reach the client
        before the engine's step that sent it has ended and published its stats (seen under
        the sanitizers), so stats read at once may still show that step's request running."""
        return self.wait_stats(lambda s: s.requests_running == 0 and s.requests_waiting == 0,
                               10 * TIME_SCALE, "the engine to publish the end of its last step")

    def metrics_text(self):
        with urllib.request.urlopen(self.metrics_url, timeout=RPC_TIMEOUT_S) as r:
            return r.read().decode()

    # -- shutdown ------------------------------------------------------------------------

    def terminate(self):
        """Sends SIGTERM (the drain starts)."""
        self.process.proc.send_signal(signal.SIGTERM)

    def stop(self):
        """SIGTERM, then waits: the exit code (kills it if it does not exit in time)."""
        self.channel.close()
        self._dir.cleanup()
        if self.alive():
            self.terminate()
        return self.process.wait()

    def kill(self):
        self.channel.close()
        self._dir.cleanup()
        self.process.kill()


def greedy_request(case, **extra):
    """The GenerateRequest that reproduces one golden case."""
    fields = dict(prompt_token_ids=case["prompt_tokens"], max_tokens=case["max_new_tokens"],
                  temperature=0.0, stop_token_ids=[BOS_TOKEN_ID])
    fields.update(extra)
    return pb().GenerateRequest(**fields)


class DaemonTestCase(unittest.TestCase):
    """A test class sharing one daemon, started in setUpClass with SETTINGS / CONFIG_YAML.

    tearDownClass stops it with SIGTERM and fails unless it exits 0 (a clean drain)."""

    SETTINGS = {}
    CONFIG_YAML = None
    # As Daemon's `model`, or a function that returns it (called once the paths are known:
    # a class attribute is set at import, before the flags are read).
    MODEL = "default"
    daemon = None

    @classmethod
    def setUpClass(cls):
        model = cls.MODEL() if callable(cls.MODEL) else cls.MODEL
        cls.daemon = Daemon(settings=cls.SETTINGS, config_yaml=cls.CONFIG_YAML, model=model,
                            title="kvd (%s)" % cls.__name__)

    @classmethod
    def tearDownClass(cls):
        if cls.daemon is not None:
            rc = cls.daemon.stop()
            if rc != 0:
                raise AssertionError("kvd exited with %s after SIGTERM\n%s" %
                                     (rc, cls.daemon.process.output()))

    def assertStillServing(self):
        """A good request after whatever the test did gets its golden output."""
        case = load_golden()[0]
        tokens, _, last = self.daemon.generate(greedy_request(case, max_tokens=16))
        self.assertEqual(tokens, case["output_tokens"][:16])
        self.assertEqual(last.finish_reason, "length")


def main():
    """Parses --kvd/--proto-dir/--shared-dir, runs the tests, prints daemon logs on failure."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--kvd", default=Paths.kvd)
    parser.add_argument("--proto-dir", default=Paths.proto_dir)
    parser.add_argument("--shared-dir", default=Paths.shared_dir)
    known, rest = parser.parse_known_args()
    Paths.kvd, Paths.proto_dir, Paths.shared_dir = known.kvd, known.proto_dir, known.shared_dir
    missing = [name for name, value in (("--kvd", Paths.kvd), ("--proto-dir", Paths.proto_dir),
                                        ("--shared-dir", Paths.shared_dir)) if not value]
    if missing:
        sys.exit("missing %s (or KVD_BINARY / KVD_PROTO_DIR / KVD_SHARED_DIR)" %
                 ", ".join(missing))
    program = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    ok = program.result.wasSuccessful()
    for p in _all_logs:
        p.kill()
    if not ok:
        for p in _all_logs:
            sys.stderr.write("\n" + p.output() + "\n")
    for p in _all_logs:
        p.close()
    sys.exit(0 if ok else 1)
