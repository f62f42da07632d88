"""SIGTERM drains: streams already accepted run to their full output, new requests are
refused with UNAVAILABLE and health turns NOT_SERVING meanwhile, and the process exits 0.
A stream the drain cuts short (drain_timeout, or a second signal) still gets a final message
with finish reason "aborted" and its usage, then UNAVAILABLE; the process still exits 0."""

import threading
import unittest

import grpc

import kvd_harness as h


class Streams:
    """NUM long greedy streams on their own threads; results[i] = (case, tokens, last message
    with a finish_reason or None, RpcError or None) once stream i has ended."""

    def __init__(self, daemon, num):
        self.cases = [c for c in h.load_golden() if c["max_new_tokens"] > 400]
        self.results = [None] * num
        self._daemon = daemon
        self.threads = [threading.Thread(target=self._stream, args=(i,), daemon=True)
                        for i in range(num)]
        for t in self.threads:
            t.start()
        # Accepted = the engine has seen all of them (one runs, the rest wait or are done).
        daemon.wait_stats(
            lambda s: s.requests_running + s.requests_waiting + s.requests_finished == num and
            s.generated_tokens > 0, 30 * h.TIME_SCALE, "all streams to be accepted")

    def _stream(self, i):
        case = self.cases[i % len(self.cases)]
        tokens, final = [], None
        try:
            for r in self._daemon.stub.Generate(h.greedy_request(case), timeout=h.RPC_TIMEOUT_S):
                tokens.extend(r.token_ids)
                if r.finish_reason:
                    final = r
            self.results[i] = (case, tokens, final, None)
        except grpc.RpcError as e:
            self.results[i] = (case, tokens, final, e)

    def running(self):
        return sum(1 for r in self.results if r is None)

    def join(self):
        for t in self.threads:
            t.join(h.RPC_TIMEOUT_S)


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
        streams = Streams(self.daemon, self.NUM_STREAMS)
        cases = streams.cases

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
        self.assertGreater(streams.running(), 0, "every stream finished before the checks: "
                           "the test proves nothing; make the work longer")
        self.assertTrue(self.daemon.alive())

        streams.join()
        for i, (case, tokens, final, error) in enumerate(streams.results):
            with self.subTest(stream=i):
                self.assertIsNone(error)
                self.assertEqual(tokens, case["output_tokens"])
                self.assertEqual(final.finish_reason, h.expected_finish_reason(case))

        self.assertEqual(self.daemon.process.wait(), 0, self.daemon.process.output())
        self.assertIn("kvd: stopped", self.daemon.process.lines)

    def test_second_sigterm_ends_the_drain_at_once_and_still_exits_0(self):
        streams = Streams(self.daemon, self.NUM_STREAMS)
        self.daemon.terminate()
        self.daemon.process.wait_for_line(r"^kvd: SIGTERM: draining", 30 * h.TIME_SCALE)
        self.assertGreater(streams.running(), 0, "every stream finished before the second "
                           "signal: the test proves nothing; make the work longer")
        self.daemon.terminate()

        # Well before the 5m drain_timeout, and not killed by the signal (rc -15).
        self.assertEqual(self.daemon.process.wait(30 * h.TIME_SCALE), 0,
                         self.daemon.process.output())
        self.daemon.process.wait_for_line(r"^kvd: second SIGTERM: aborting \d+ requests",
                                          h.EXIT_TIMEOUT_S)
        streams.join()
        assertFinishedOrAborted(self, streams)


def assertFinishedOrAborted(test, streams):
    """Each stream either ran to its golden output, or ended with a final message (finish
    reason "aborted", usage counting every token it was sent) and then UNAVAILABLE; at least
    one was aborted."""
    aborted = 0
    for i, (case, tokens, final, error) in enumerate(streams.results):
        with test.subTest(stream=i):
            test.assertIsNotNone(final, "stream %d ended without a final message (%s)" %
                                 (i, error))
            if error is None:
                test.assertEqual(tokens, case["output_tokens"])
                test.assertEqual(final.finish_reason, h.expected_finish_reason(case))
                continue
            aborted += 1
            test.assertEqual(error.code(), grpc.StatusCode.UNAVAILABLE, error.details())
            test.assertEqual(final.finish_reason, "aborted")
            test.assertEqual(final.usage.completion_tokens, len(tokens))
            test.assertEqual(tokens, case["output_tokens"][:len(tokens)])
    test.assertGreater(aborted, 0, "no stream was aborted: the test proves nothing")


class DrainTimeoutTest(unittest.TestCase):
    NUM_STREAMS = 4

    def test_drain_timeout_aborts_with_a_final_message_then_unavailable(self):
        daemon = h.Daemon(settings={"kv_cache_config.max_batch_size": "1",
                                    "server.num_threads": "1",
                                    "server.drain_timeout": "0s"},
                          title="kvd (drain timeout)")
        self.addCleanup(daemon.kill)
        streams = Streams(daemon, self.NUM_STREAMS)
        daemon.terminate()
        self.assertEqual(daemon.process.wait(), 0, daemon.process.output())
        self.assertTrue(any(line.startswith("kvd: drain timeout: aborting")
                            for line in daemon.process.lines), daemon.process.output())
        streams.join()
        assertFinishedOrAborted(self, streams)


if __name__ == "__main__":
    h.main()
