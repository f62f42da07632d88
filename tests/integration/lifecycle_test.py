"""What happens to KV blocks over a request's and a session's life: a session's second turn
reuses the first turn's KV, the pins go after the idle timeout or on CloseSession, and a
cancelled stream gives its blocks back."""

import re
import threading
import time

import grpc

import kvd_harness as h

# A session's pins go after this long without a turn: long enough that the second turn
# comes in time on a busy 2-core machine (longer still in slow sanitizer builds).
IDLE_TIMEOUT_S = 4.0


def session_turns(daemon, session_id, case, first_len, new_tokens):
    """Turn 1 generates first_len tokens; turn 2 sends the whole conversation plus
    new_tokens. Returns (turn-2 prompt, turn-1 last message, turn-2 tokens, turn-2 last)."""
    turn1_tokens, _, turn1 = daemon.generate(
        h.greedy_request(case, max_tokens=first_len, session_id=session_id))
    prompt2 = case["prompt_tokens"] + turn1_tokens + new_tokens
    tokens2, _, turn2 = daemon.generate(
        h.pb().GenerateRequest(prompt_token_ids=prompt2, max_tokens=20, temperature=0.0,
                               stop_token_ids=[h.BOS_TOKEN_ID], session_id=session_id))
    return prompt2, turn1, tokens2, turn2


class SessionIdleTest(h.DaemonTestCase):
    # Prefix caching off: a cached prompt can only come from the session's pins.
    SETTINGS = {
        "kv_cache_config.session.idle_timeout": "%gs" % (IDLE_TIMEOUT_S * h.TIME_SCALE),
        "kv_cache_config.enable_prefix_caching": "false",
    }

    def test_second_turn_reuses_kv_and_pins_go_after_idle_timeout(self):
        case = h.load_golden()[0]
        new_tokens = [13, 317, 336]  # "\nLily said" -- any in-vocabulary ids do
        prompt2, turn1, tokens2, turn2 = session_turns(self.daemon, "story-1", case, 40,
                                                       new_tokens)
        self.assertEqual(turn1.usage.cached_prompt_tokens, 0)
        self.assertEqual(turn2.usage.prompt_tokens, len(prompt2))
        # 45 tokens of KV were kept (the last sampled token has none): two full blocks at least.
        self.assertGreaterEqual(turn2.usage.cached_prompt_tokens, 32, turn2.usage)
        self.assertLess(turn2.usage.cached_prompt_tokens, len(prompt2))

        # The reused KV gives the same tokens as computing the whole prompt afresh.
        fresh, _, _ = self.daemon.generate(
            h.pb().GenerateRequest(prompt_token_ids=prompt2, max_tokens=20, temperature=0.0,
                                   stop_token_ids=[h.BOS_TOKEN_ID]))
        self.assertEqual(tokens2, fresh)

        stats = self.daemon.wait_stats(lambda s: s.pinned_blocks == 0,
                                       10 * IDLE_TIMEOUT_S * h.TIME_SCALE,
                                       "the idle session to be unpinned")
        self.assertGreaterEqual(stats.session_releases_idle, 1)
        self.assertEqual(stats.used_blocks, 0)


class SessionCloseTest(h.DaemonTestCase):
    SETTINGS = {"kv_cache_config.session.idle_timeout": "10m"}

    def test_pins_stay_until_close_session_releases_them(self):
        case = h.load_golden()[2]
        _, _, _, turn2 = session_turns(self.daemon, "chat-7", case, 60, [13])
        self.assertGreater(turn2.usage.cached_prompt_tokens, 0, turn2.usage)
        stats = self.daemon.idle_stats()
        self.assertGreater(stats.pinned_blocks, 0, stats)
        self.assertEqual(stats.num_sessions, 1)

        self.daemon.stub.CloseSession(h.pb().CloseSessionRequest(session_id="chat-7"),
                                      timeout=h.RPC_TIMEOUT_S)
        stats = self.daemon.wait_stats(lambda s: s.pinned_blocks == 0, 10 * h.TIME_SCALE,
                                       "CloseSession to unpin the blocks")
        self.assertEqual(stats.num_sessions, 0)
        self.assertGreaterEqual(stats.session_releases_closed, 1)

        with self.assertRaises(grpc.RpcError) as e:
            self.daemon.stub.CloseSession(h.pb().CloseSessionRequest(session_id="chat-7"),
                                          timeout=h.RPC_TIMEOUT_S)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)


class CancelTest(h.DaemonTestCase):
    # One sequence at a time on one thread: the queued work takes far longer than a cancel.
    SETTINGS = {"kv_cache_config.max_batch_size": "1", "server.num_threads": "1"}
    NUM_STREAMS = 12
    MAX_TOKENS = 500

    def test_cancelled_streams_free_their_blocks(self):
        calls = []
        first_message = threading.Event()

        def consume(call):
            try:
                for _ in call:
                    first_message.set()
            except grpc.RpcError:
                pass

        threads = []
        for i in range(self.NUM_STREAMS):
            request = h.pb().GenerateRequest(prompt_token_ids=[1, 403, 407, 261, 378, 10 + i],
                                             max_tokens=self.MAX_TOKENS, ignore_eos=True)
            call = self.daemon.stub.Generate(request, timeout=h.RPC_TIMEOUT_S)
            calls.append(call)
            threads.append(threading.Thread(target=consume, args=(call,), daemon=True))
            threads[-1].start()
        self.assertTrue(first_message.wait(h.RPC_TIMEOUT_S), "no stream produced a token")
        stats = self.daemon.cache_stats()
        self.assertGreater(stats.used_blocks, 0, stats)

        for call in calls:
            call.cancel()
        for t in threads:
            t.join(h.RPC_TIMEOUT_S)
        cancelled_at = time.monotonic()

        stats = self.daemon.wait_stats(
            lambda s: s.used_blocks == 0 and s.requests_running == 0 and s.requests_waiting == 0,
            10 * h.TIME_SCALE, "the cancelled streams' blocks to be freed")
        self.assertLess(time.monotonic() - cancelled_at, 10 * h.TIME_SCALE)
        # The work was cut short, not run to completion.
        self.assertLess(stats.generated_tokens, self.NUM_STREAMS * self.MAX_TOKENS // 2, stats)
        for call in calls:
            self.assertEqual(call.code(), grpc.StatusCode.CANCELLED)
        # The metrics say how they ended: every one cancelled (none can have ended by length
        # first: the work was cut short, above, long before 500 tokens each).
        finished = re.findall(r'(?m)^kvd_requests_finished_total\{reason="(\w+)"\} (\S+)$',
                              self.daemon.metrics_text())
        self.assertEqual({reason: float(value) for reason, value in finished},
                         {"length": 0, "stop": 0, "context_limit": 0,
                          "cancelled": self.NUM_STREAMS, "deadline": 0, "aborted": 0})
        self.assertStillServing()


if __name__ == "__main__":
    h.main()
