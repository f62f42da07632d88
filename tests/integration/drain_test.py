"""SIGTERM drains: streams already accepted run to their full output, new requests are
refused with UNAVAILABLE and health turns NOT_SERVING meanwhile, and the process exits 0."""

import threading
import unittest

import grpc

import kvd_harness as h


class DrainTest(unittest.TestCase):
    NUM_STREAMS = 8

    def setUp(self):
        # One sequence per step on one thread, so the accepted work outlasts the checks below.
        self.daemon = h.Daemon(settings={"kv_cache_config.max_batch_size": "1",
                                         "server.num_threads": "1",
                                         "server.drain_timeout": "5m"},
                               title="kvd (drain)")
        self.addCleanup(self.daemon.kill)

    def test_sigterm_finishes_accepted_streams_and_refuses_new_ones(self):
        cases = [c for c in h.load_golden() if c["max_new_tokens"] > 400]
        results = [None] * self.NUM_STREAMS
        started = [threading.Event() for _ in range(self.NUM_STREAMS)]

        def stream(i):
            case = cases[i % len(cases)]
            tokens, reason = [], None
            try:
                for r in self.daemon.stub.Generate(h.greedy_request(case),
                                                   timeout=h.RPC_TIMEOUT_S):
                    tokens.extend(r.token_ids)
                    reason = r.finish_reason or reason
                    started[i].set()
                results[i] = (case, tokens, reason, None)
            except grpc.RpcError as e:
                results[i] = (case, tokens, reason, e)
            started[i].set()

        threads = [threading.Thread(target=stream, args=(i,), daemon=True)
                   for i in range(self.NUM_STREAMS)]
        for t in threads:
            t.start()
        # Accepted = the engine has seen all of them (one runs, the rest wait or are done).
        self.daemon.wait_stats(
            lambda s: s.requests_running + s.requests_waiting + s.requests_finished ==
            self.NUM_STREAMS and s.generated_tokens > 0, 30 * h.TIME_SCALE,
            "all streams to be accepted")

        self.daemon.terminate()
        self.daemon.process.wait_for_line(r"^kvd: SIGTERM: draining", 30 * h.TIME_SCALE)

        # While draining: new work is refused, health says NOT_SERVING.
        with self.assertRaises(grpc.RpcError) as e:
            self.daemon.generate(h.greedy_request(cases[0], max_tokens=4))
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("drain", e.exception.details())
        health = self.daemon.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=h.health_pb().HealthCheckRequest.SerializeToString,
            response_deserializer=h.health_pb().HealthCheckResponse.FromString)
        status = health(h.health_pb().HealthCheckRequest(service=""), timeout=h.RPC_TIMEOUT_S)
        self.assertEqual(status.status, h.health_pb().HealthCheckResponse.NOT_SERVING)
        running = sum(1 for r in results if r is None)
        self.assertGreater(running, 0, "every stream finished before the checks: the test "
                           "proves nothing; make the work longer")
        self.assertTrue(self.daemon.alive())

        for t in threads:
            t.join(h.RPC_TIMEOUT_S)
        for i, (case, tokens, reason, error) in enumerate(results):
            with self.subTest(stream=i):
                self.assertIsNone(error)
                self.assertEqual(tokens, case["output_tokens"])
                self.assertEqual(reason, h.expected_finish_reason(case))

        self.assertEqual(self.daemon.process.wait(), 0, self.daemon.process.output())
        self.assertIn("kvd: stopped", self.daemon.process.lines)


if __name__ == "__main__":
    h.main()
