"""SIGTERM (as SIGINT and SIGHUP) drains: streams already accepted run to their full output,
new requests are refused with UNAVAILABLE and health turns NOT_SERVING meanwhile, and the
process exits 0.
A stream the drain cuts short (drain_timeout, or a second signal) still gets a final message
with finish reason "aborted" and its usage, then UNAVAILABLE; the process still exits 0."""

import os
import signal
import tempfile
import threading
import time
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
        self.assertEqual(self.daemon.health(), h.health_pb().HealthCheckResponse.NOT_SERVING)
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

    def test_sighup_drains_as_sigterm_does_and_says_it_reloads_nothing(self):
        # A closed terminal (make serve's) sends SIGHUP: it used to kill the daemon at once
        # (exit 129), dropping every accepted stream.
        streams = Streams(self.daemon, self.NUM_STREAMS)
        self.daemon.process.proc.send_signal(signal.SIGHUP)
        self.daemon.process.wait_for_line(
            r"^kvd: SIGHUP: draining \(up to .*\); kvd does not reload its config on SIGHUP",
            30 * h.TIME_SCALE)
        self.assertGreater(streams.running(), 0, "every stream finished before the checks: "
                           "the test proves nothing; make the work longer")
        streams.join()
        for i, (case, tokens, final, error) in enumerate(streams.results):
            with self.subTest(stream=i):
                self.assertIsNone(error)
                self.assertEqual(tokens, case["output_tokens"])
        self.assertEqual(self.daemon.process.wait(), 0, self.daemon.process.output())

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


class StartupSignalTest(unittest.TestCase):
    """A signal while kvd is still starting (here: blocked reading a config pipe nobody has
    written, as a long model load would block it) ends the process at once, exit 0, without
    ever serving. It used to wait, unseen, until startup ended, then serve and drain."""

    def wait_until_signals_are_taken(self, proc):
        """Until kvd blocks SIGINT, SIGTERM and SIGHUP to take them itself (its first step in `serve`;
        loading the binary's libraries takes a second or more, and a signal then kills it).
        Seen on the startup thread, which inherits the mask: the main thread's own mask reads
        unblocked while it sits in sigtimedwait."""
        deadline = time.monotonic() + 30 * h.TIME_SCALE
        mask = ((1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1)) |
                (1 << (signal.SIGHUP - 1)))
        pid = proc.proc.pid
        while time.monotonic() < deadline:
            self.assertIsNone(proc.proc.poll(), proc.output())
            for tid in os.listdir("/proc/%d/task" % pid):
                if int(tid) == pid:
                    continue
                try:
                    with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                        blocked = [line for line in f if line.startswith("SigBlk:")]
                except OSError:  # the thread ended
                    continue
                if blocked and int(blocked[0].split()[1], 16) & mask == mask:
                    return
            time.sleep(0.02)
        self.fail("kvd never blocked SIGINT, SIGTERM and SIGHUP\n" + proc.output())

    def run_case(self, signum, name):
        with tempfile.TemporaryDirectory(prefix="kvd_fifo_") as d:
            fifo = os.path.join(d, "config.yaml")
            os.mkfifo(fifo)
            proc = h.Process("kvd (startup %s)" % name,
                             [h.Paths.kvd, "serve", "--config", fifo, "--model", h.Paths.model(),
                              "--grpc-address", "127.0.0.1:0", "--metrics-address", ""])
            self.addCleanup(proc.close)
            self.wait_until_signals_are_taken(proc)
            time.sleep(0.2 * h.TIME_SCALE)  # into reading the pipe
            self.assertIsNone(proc.proc.poll(), proc.output())
            proc.proc.send_signal(signum)
            self.assertEqual(proc.wait(timeout_s=5 * h.TIME_SCALE), 0, proc.output())
            self.assertIn("kvd: %s before serving started: exiting" % name, proc.lines,
                          proc.output())
            self.assertFalse(any("serving gRPC" in line for line in proc.lines), proc.output())

    def test_sigterm_during_startup_exits_0_at_once(self):
        self.run_case(signal.SIGTERM, "SIGTERM")

    def test_sigint_during_startup_exits_0_at_once(self):
        self.run_case(signal.SIGINT, "SIGINT")

    def test_sighup_during_startup_exits_0_at_once(self):
        self.run_case(signal.SIGHUP, "SIGHUP")


if __name__ == "__main__":
    h.main()
