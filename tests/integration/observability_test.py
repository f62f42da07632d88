"""What operators and tools see: grpc.health.v1 says SERVING, server reflection lists the
API (so grpcurl works without the proto), GetModelInfo describes the model, and a real
Prometheus server scrapes kvd_* series from /metrics."""

import json
import os
import re
import shutil
import socket
import struct
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import grpc

import kvd_harness as h

PROMETHEUS = "/usr/bin/prometheus"


class HealthAndReflectionTest(h.DaemonTestCase):

    def test_health_is_serving_overall_and_for_the_service(self):
        for service in ["", "kvd.v1.Inference"]:
            with self.subTest(service=service):
                self.assertEqual(self.daemon.health(service),
                                 h.health_pb().HealthCheckResponse.SERVING)
        with self.assertRaises(grpc.RpcError) as e:
            self.daemon.health("no.such.Service")
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)

    def reflect(self, request):
        """One ServerReflectionInfo exchange, over v1alpha (what gRPC 1.51 serves) or v1."""
        rpb = h.reflection_pb()
        last_error = None
        for version in ["v1alpha", "v1"]:
            call = self.daemon.channel.stream_stream(
                "/grpc.reflection.%s.ServerReflection/ServerReflectionInfo" % version,
                request_serializer=rpb.ServerReflectionRequest.SerializeToString,
                response_deserializer=rpb.ServerReflectionResponse.FromString)
            try:
                return next(iter(call(iter([request]), timeout=h.RPC_TIMEOUT_S)))
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                last_error = e
        raise last_error

    def test_reflection_lists_the_services(self):
        r = self.reflect(h.reflection_pb().ServerReflectionRequest(list_services="*"))
        names = {s.name for s in r.list_services_response.service}
        self.assertIn("kvd.v1.Inference", names)
        self.assertIn("grpc.health.v1.Health", names)

    def test_reflection_serves_the_api_descriptor(self):
        from google.protobuf import descriptor_pb2
        r = self.reflect(h.reflection_pb().ServerReflectionRequest(
            file_containing_symbol="kvd.v1.Inference"))
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in r.file_descriptor_response.file_descriptor_proto]
        api = [f for f in files if f.package == "kvd.v1"]
        self.assertTrue(api, [f.name for f in files])
        methods = {m.name for s in api[0].service for m in s.method}
        self.assertTrue({"Generate", "CloseSession", "GetModelInfo", "GetCacheStats"} <= methods)

    def test_model_info_describes_stories260k(self):
        info = self.daemon.stub.GetModelInfo(h.pb().GetModelInfoRequest(),
                                             timeout=h.RPC_TIMEOUT_S)
        self.assertEqual((info.num_layers, info.dim, info.num_heads, info.num_kv_heads),
                         (5, 64, 8, 4))
        self.assertEqual(info.vocab_size, 512)
        self.assertEqual(info.max_context_tokens, 512)
        self.assertEqual(info.block_size, 16)
        self.assertEqual(info.bos_token_id, 1)
        self.assertEqual(list(info.end_token_ids), [1, 2])  # a story ends at BOS, a chat at EOS

    def test_metrics_endpoint_speaks_prometheus_text(self):
        self.daemon.generate(h.greedy_request(h.load_golden()[0], max_tokens=8))
        text = self.daemon.metrics_text()
        for series in ["kvd_num_requests_waiting", "kvd_num_requests_running",
                       "kvd_kv_cache_usage_ratio", "kvd_generation_tokens_total"]:
            self.assertRegex(text, r"(?m)^# TYPE %s " % series)
        self.assertRegex(text, r'(?m)^kvd_cache_config_info\{.*block_size="16".*\} 1')


def llama2c_parameter_bytes(path):
    """fp32 bytes of a llama2.c checkpoint's parameters, from its header alone (version 0:
    seven int32s; a negative vocab_size means a separate classifier)."""
    with open(path, "rb") as f:
        dim, hidden, layers, heads, kv_heads, vocab, _ = struct.unpack("<7i", f.read(28))
    head_dim = dim // heads
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    per_layer = 2 * dim + dim * (q_dim + 2 * kv_dim) + q_dim * dim + 3 * hidden * dim
    params = abs(vocab) * dim + layers * per_layer + dim
    if vocab < 0:
        params += abs(vocab) * dim
    return 4 * params


def memory_series(text):
    """kvd_memory_bytes and kvd_device_memory_bytes samples: {(name, label value): value}."""
    out = {}
    for m in re.finditer(r'(?m)^(kvd_(?:device_)?memory_bytes)\{\w+="(\w+)"\} (\S+)$', text):
        out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


class MemoryReportTest(h.DaemonTestCase):
    """Where the memory went: the startup line and kvd_memory_bytes agree with the model's
    parameters and the KV pool, and activations grow once a batch has run; the standard
    process series are there."""

    def test_startup_line_and_metrics_say_where_the_memory_went(self):
        weights = llama2c_parameter_bytes(h.Paths.model())
        line = self.daemon.process.wait_for_line(r"^kvd: memory: (.*)$", h.STARTUP_TIMEOUT_S)
        # stories260K: 260,032 fp32 parameters; the default 1 GiB pool, rounded up to chunks.
        self.assertEqual(weights, 260032 * 4)
        m = re.match(r"^weights 1015\.8 KiB, KV pool 1\.01 GiB, activations and other buffers "
                     r"([0-9.]+) (B|KiB) \(", line.group(1))
        self.assertIsNotNone(m, line.group(1))
        # Before any batch: the arena's chunk table (819 pointers) and little else.
        at_startup = float(m.group(1)) * (1024 if m.group(2) == "KiB" else 1)
        self.assertLess(at_startup, 8 * 1024)
        case = h.load_golden()[0]
        self.daemon.generate(h.greedy_request(case, max_tokens=8))
        text = self.daemon.metrics_text()
        got = memory_series(text)
        reserved = float(re.search(r"(?m)^kvd_kv_pool_reserved_bytes (\S+)$", text).group(1))
        self.assertEqual(got[("kvd_memory_bytes", "weights")], weights)
        self.assertEqual(got[("kvd_memory_bytes", "kv_pool")], reserved)
        # The batch's activations on top: per prompt token at least its residual row, fused
        # Q/K/V row and gate/up row in fp32 (64 + 128 + 2 x 172 floats).
        self.assertGreater(got[("kvd_memory_bytes", "activations")],
                           at_startup + len(case["prompt_tokens"]) * (64 + 128 + 344) * 4)
        self.assertEqual(got[("kvd_memory_bytes", "workspace")], 0)  # the CPU backend keeps none
        # No GPU, no device series (rather than zeros).
        self.assertNotIn(("kvd_device_memory_bytes", "total"), got)

    def test_process_series_are_the_standard_collectors(self):
        text = self.daemon.metrics_text()

        def value(name):
            m = re.search(r"(?m)^%s (\S+)$" % name, text)
            self.assertIsNotNone(m, "no %s in the scrape" % name)
            return float(m.group(1))

        self.assertRegex(text, r"(?m)^# TYPE process_cpu_seconds_total counter$")
        # At least the weights are resident; the pool is reserved but committed lazily.
        self.assertGreater(value("process_resident_memory_bytes"),
                           llama2c_parameter_bytes(h.Paths.model()))
        self.assertGreaterEqual(value("process_virtual_memory_bytes"),
                                value("kvd_kv_pool_reserved_bytes"))
        started = value("process_start_time_seconds")
        self.assertLessEqual(started, time.time() + 1)
        self.assertGreater(started, time.time() - 3600)
        self.assertGreaterEqual(value("process_open_fds"), 3)
        self.assertGreaterEqual(value("kvd_process_threads"), 3)  # main, engine, gRPC at least


def prometheus_query(base_url, query):
    url = "%s/api/v1/query?%s" % (base_url, urllib.parse.urlencode({"query": query}))
    with urllib.request.urlopen(url, timeout=h.RPC_TIMEOUT_S) as r:
        body = json.loads(r.read().decode())
    if body.get("status") != "success":
        raise AssertionError("query %r failed: %s" % (query, body))
    return body["data"]["result"]


# Skipped where Prometheus is missing, except in CI (CI set), where `make test` installed it
# (scripts/install-deps --test): there a missing binary is a broken set-up, and fails.
@unittest.skipUnless(os.access(PROMETHEUS, os.X_OK) or os.environ.get("CI"),
                     "%s is missing: install Debian's `prometheus` package "
                     "(scripts/install-deps --test does)" % PROMETHEUS)
class PrometheusScrapeTest(h.DaemonTestCase):

    @classmethod
    def setUpClass(cls):
        if not os.access(PROMETHEUS, os.X_OK):
            raise AssertionError("%s is missing though CI is set: scripts/install-deps --test "
                                 "(make test) should have installed it" % PROMETHEUS)
        super().setUpClass()
        cls.dir = tempfile.mkdtemp(prefix="kvd_prometheus_")
        config = os.path.join(cls.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "scrape_configs:\n  - job_name: kvd\n    static_configs:\n"
                    "      - targets: ['%s']\n" % cls.daemon.metrics_host_port)
        port = h.free_port()
        cls.prometheus_url = "http://127.0.0.1:%d" % port
        cls.prometheus = h.Process("prometheus", [
            PROMETHEUS, "--config.file=" + config,
            "--storage.tsdb.path=" + os.path.join(cls.dir, "data"),
            "--web.listen-address=127.0.0.1:%d" % port, "--log.level=warn"])

    @classmethod
    def tearDownClass(cls):
        cls.prometheus.kill()
        shutil.rmtree(cls.dir, ignore_errors=True)
        super().tearDownClass()

    def wait_for_series(self, query, predicate, timeout_s):
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            self.assertIsNone(self.prometheus.proc.poll(), self.prometheus.output())
            try:
                last = prometheus_query(self.prometheus_url, query)
                if last and predicate(last):
                    return last
            except OSError as e:  # not listening yet
                last = e
            time.sleep(0.25)
        self.fail("Prometheus never returned %r as expected; last answer: %s" % (query, last))

    def test_prometheus_scrapes_kvd_series(self):
        case = h.load_golden()[0]
        tokens, _, _ = self.daemon.generate(h.greedy_request(case))
        timeout = 60 * h.TIME_SCALE

        up = self.wait_for_series('up{job="kvd"}', lambda r: r[0]["value"][1] == "1", timeout)
        self.assertEqual(up[0]["metric"]["instance"], self.daemon.metrics_host_port)
        generated = self.wait_for_series(
            "kvd_generation_tokens_total",
            lambda r: float(r[0]["value"][1]) >= len(tokens), timeout)
        self.assertEqual(float(generated[0]["value"][1]), len(tokens))
        # The Gateway API Inference Extension's three signals.
        for query in ["kvd_num_requests_waiting", "kvd_num_requests_running",
                      "kvd_kv_cache_usage_ratio"]:
            with self.subTest(query=query):
                result = self.wait_for_series(query, lambda r: True, timeout)
                self.assertEqual(float(result[0]["value"][1]), 0.0)
        info = self.wait_for_series("kvd_cache_config_info", lambda r: True, timeout)
        self.assertEqual(info[0]["metric"]["block_size"], "16")
        names = self.wait_for_series('count by (__name__) ({__name__=~"kvd_.+"})',
                                     lambda r: len(r) >= 20, timeout)
        self.assertGreaterEqual(len(names), 20)



class UnixSocketMetricsTest(unittest.TestCase):
    """Metrics on a unix socket: the startup line names the socket (an http://unix:... URL
    reaches nothing), and GET /metrics over the socket answers."""

    def test_metrics_over_a_unix_socket(self):
        with tempfile.TemporaryDirectory(prefix="kvd_sock_") as d:
            path = os.path.join(d, "metrics.sock")
            proc = h.Process("kvd (unix metrics)",
                             [h.Paths.kvd, "serve", "--model", h.Paths.model(),
                              "--grpc-address", "127.0.0.1:0", "--metrics-address", "unix:" + path])
            self.addCleanup(proc.close)
            proc.wait_for_line(r"^kvd: serving metrics on unix:%s \(HTTP GET /metrics\)$" %
                               re.escape(path), h.STARTUP_TIMEOUT_S)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(h.RPC_TIMEOUT_S)
                s.connect(path)
                s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                reply = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
            self.assertTrue(reply.startswith(b"HTTP/1.1 200") or reply.startswith(b"HTTP/1.0 200"),
                            reply[:200])
            self.assertIn(b"kvd_num_requests_waiting", reply)
            proc.proc.terminate()
            self.assertEqual(proc.wait(), 0, proc.output())


if __name__ == "__main__":
    h.main()
