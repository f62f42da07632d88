"""Bad requests get the documented status and a message naming the field, and the daemon
keeps serving after every one (bad config files: config_files_test.py)."""

import queue
import time

import grpc

import kvd_harness as h

CONTEXT = 512  # stories260K
VOCAB = 512
PROMPT = [1, 403, 407, 261, 378]  # "Once upon a time" with BOS

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def request(**fields):
    base = dict(prompt_token_ids=PROMPT, max_tokens=4)
    base.update(fields)
    if "prompt" in fields and "prompt_token_ids" not in fields:
        del base["prompt_token_ids"]
    return h.pb().GenerateRequest(**base)


def raw(*fields):
    """Wire bytes of a GenerateRequest, built field by field (may hold invalid UTF-8)."""
    return b"".join(fields)


# (name, request or wire bytes, expected code, regex the status message must match)
def generate_cases():
    return [
        ("no prompt at all", request(prompt_token_ids=[]), INVALID, r"prompt"),
        ("prompt and prompt_token_ids", request(prompt="Once", prompt_token_ids=PROMPT),
         INVALID, r"prompt"),
        ("max_tokens past the context", request(max_tokens=CONTEXT), INVALID,
         r"^max_tokens.*allowed"),
        ("max_tokens far past the context", request(max_tokens=1 << 31), INVALID,
         r"^max_tokens"),
        ("temperature negative", request(temperature=-0.5), INVALID,
         r"^temperature.*allowed"),
        ("temperature too high", request(temperature=101.0), INVALID,
         r"^temperature.*allowed"),
        ("temperature NaN", request(temperature=float("nan")), INVALID, r"^temperature"),
        ("top_p above 1", request(top_p=1.5), INVALID, r"^top_p.*allowed"),
        ("top_p negative", request(top_p=-0.1), INVALID, r"^top_p"),
        ("min_p above 1", request(min_p=2.0), INVALID, r"^min_p"),
        ("top_k above vocab", request(top_k=VOCAB + 1), INVALID, r"^top_k"),
        ("token id == vocab size", request(prompt_token_ids=[1, VOCAB]), INVALID,
         r"^prompt_token_ids"),
        ("token id 2^32-1", request(prompt_token_ids=[1, 2**32 - 1]), INVALID,
         r"^prompt_token_ids"),
        ("token prompt longer than the context", request(prompt_token_ids=[1] * (CONTEXT + 1)),
         INVALID, r"^prompt"),
        ("text prompt over the byte limit", request(prompt="a" * ((1 << 20) + 1)), INVALID,
         r"^prompt"),
        ("text prompt longer than the context", request(prompt="Once upon a time " * 200),
         INVALID, r"^prompt"),
        ("empty stop string", request(stop=[""]), INVALID, r"^stop"),
        ("too many stop strings", request(stop=["x%d" % i for i in range(17)]), INVALID,
         r"^stop"),
        ("stop token id outside the vocab", request(stop_token_ids=[VOCAB]), INVALID,
         r"^stop_token_ids"),
        ("expected_output_tokens past the context", request(expected_output_tokens=CONTEXT + 1),
         INVALID, r"^expected_output_tokens"),
        ("session_id too long", request(session_id="s" * 300), INVALID,
         r"^session_id: is 300 bytes long"),
        ("request_id with a control character", request(request_id="a\nb"), INVALID,
         r"^request_id: contains a control character \(0x0a at byte 1\)"),
        # protobuf-python refuses to put these bytes in a string field: hand-encoded.
        ("prompt not UTF-8", raw(h.wire_bytes(1, b"Once \xff\xfe upon"), h.wire_varint(3, 4)),
         INVALID, r"^prompt.*UTF-8"),
        ("truncated UTF-8 sequence in prompt", raw(h.wire_bytes(1, b"caf\xc3"),
                                                   h.wire_varint(3, 4)),
         INVALID, r"^prompt.*UTF-8"),
        ("stop string not UTF-8",
         raw(h.wire_bytes(1, b"Once"), h.wire_varint(3, 4), h.wire_bytes(8, b"\xc0\xaf")),
         INVALID, r"^stop.*UTF-8"),
        ("session_id not UTF-8",
         raw(h.wire_bytes(1, b"Once"), h.wire_varint(3, 4), h.wire_bytes(10, b"\xed\xa0\x80")),
         INVALID, r"^session_id.*UTF-8"),
        ("malformed wire bytes", b"\x0a\x50abc", INVALID,
         r"^request: not a valid kvd\.v1\.GenerateRequest message"),
    ]


class BadRequestTest(h.DaemonTestCase):

    def call(self, req):
        """Runs a Generate; returns the RpcError (fails if the call succeeded)."""
        if isinstance(req, bytes):
            generate = self.daemon.channel.unary_stream(
                "/kvd.v1.Inference/Generate", request_serializer=lambda b: b,
                response_deserializer=h.pb().GenerateResponse.FromString)
        else:
            generate = self.daemon.stub.Generate
        try:
            responses = list(generate(req, timeout=h.RPC_TIMEOUT_S))
        except grpc.RpcError as e:
            return e
        self.fail("the call succeeded: %s" % responses[-1:])

    def test_bad_generate_requests(self):
        cases = generate_cases()
        self.assertGreaterEqual(len(cases), 20)
        for name, req, code, message in cases:
            with self.subTest(name):
                error = self.call(req)
                self.assertEqual(error.code(), code, error.details())
                self.assertRegex(error.details(), message)
                self.assertStillServing()

    def test_good_utf8_through_the_hand_encoder_works(self):
        # The raw path itself is sound: valid bytes are served.
        generate = self.daemon.channel.unary_stream(
            "/kvd.v1.Inference/Generate", request_serializer=lambda b: b,
            response_deserializer=h.pb().GenerateResponse.FromString)
        responses = list(generate(raw(h.wire_bytes(1, "Once upon a time".encode()),
                                      h.wire_varint(3, 8)), timeout=h.RPC_TIMEOUT_S))
        self.assertEqual(responses[-1].finish_reason, "length")
        self.assertEqual(responses[-1].usage.completion_tokens, 8)

    def test_close_unknown_session_is_not_found(self):
        with self.assertRaises(grpc.RpcError) as e:
            self.daemon.stub.CloseSession(h.pb().CloseSessionRequest(session_id="never-opened"),
                                          timeout=h.RPC_TIMEOUT_S)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertStillServing()

    def test_close_empty_session_id_is_refused(self):
        with self.assertRaises(grpc.RpcError) as e:
            self.daemon.stub.CloseSession(h.pb().CloseSessionRequest(session_id=""),
                                          timeout=h.RPC_TIMEOUT_S)
        self.assertEqual(e.exception.code(), INVALID)
        self.assertStillServing()

    def test_deadline_exceeded(self):
        before = self.daemon.cache_stats().generated_tokens
        req = request(max_tokens=500, ignore_eos=True)
        with self.assertRaises(grpc.RpcError) as e:
            list(self.daemon.stub.Generate(req, timeout=0.001))
        self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        stats = self.daemon.wait_stats(
            lambda s: s.used_blocks == 0 and s.requests_running == 0 and s.requests_waiting == 0,
            10 * h.TIME_SCALE, "the expired request to be dropped")
        # The client's library reports the deadline whatever the server does, and the request
        # would free its blocks by itself once done: the daemon stopped it before its end.
        self.assertLess(stats.generated_tokens - before, 500)
        self.assertStillServing()


class TinyPoolTest(h.DaemonTestCase):
    # Eight blocks of 16 tokens: 128 tokens of KV in all.
    SETTINGS = {"kv_cache_config.memory_pool.initial_size": "160KiB",
                "kv_cache_config.memory_pool.max_size": "160KiB"}

    def test_prompt_that_cannot_fit_the_pool_is_resource_exhausted(self):
        stats = self.daemon.cache_stats()
        pool_tokens = stats.max_blocks * stats.block_size
        self.assertLess(pool_tokens, 400, stats)
        req = request(prompt_token_ids=[1] + [400] * pool_tokens, max_tokens=1)
        with self.assertRaises(grpc.RpcError) as e:
            list(self.daemon.stub.Generate(req, timeout=h.RPC_TIMEOUT_S))
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                         e.exception.details())
        self.assertGreaterEqual(self.daemon.cache_stats().requests_rejected, 1)
        self.assertStillServing()

    def test_the_default_max_tokens_is_capped_by_the_pool(self):
        # Without max_tokens the server default (256) applies, capped by what the pool
        # leaves: the request runs instead of being refused for a value it never sent.
        stats = self.daemon.cache_stats()
        pool_tokens = stats.max_blocks * stats.block_size
        prompt = [1] + [400] * 9
        final = None
        tokens = []
        for r in self.daemon.stub.Generate(request(prompt_token_ids=prompt, max_tokens=0,
                                                   ignore_eos=True),
                                           timeout=h.RPC_TIMEOUT_S):
            tokens.extend(r.token_ids)
            if r.finish_reason:
                final = r
        self.assertEqual(final.finish_reason, "length")
        self.assertEqual(len(tokens), pool_tokens + 1 - len(prompt))
        self.assertStillServing()


class ShortContextTest(h.DaemonTestCase):
    # kv_cache_config.max_seq_length below the model's 512: the context every request gets.
    SETTINGS = {"kv_cache_config.max_seq_length": "64"}

    def generate(self, **fields):
        tokens, final = [], None
        for r in self.daemon.stub.Generate(request(**fields), timeout=h.RPC_TIMEOUT_S):
            tokens.extend(r.token_ids)
            if r.finish_reason:
                final = r
        return tokens, final

    def test_the_default_max_tokens_runs_to_the_context_and_says_so(self):
        # The server default (256) is more than the context leaves: the stream ends there with
        # "context_limit", not "length", so a client can tell the two apart.
        tokens, final = self.generate(max_tokens=0, ignore_eos=True)
        self.assertEqual(final.finish_reason, "context_limit")
        self.assertEqual(len(tokens), 64 + 1 - len(PROMPT))  # the last token takes no position
        self.assertEqual(final.usage.completion_tokens, len(tokens))
        self.assertStillServing()

    def test_a_max_tokens_that_ends_at_the_context_is_length(self):
        tokens, final = self.generate(max_tokens=64 + 1 - len(PROMPT), ignore_eos=True)
        self.assertEqual(final.finish_reason, "length")
        self.assertEqual(len(tokens), 64 + 1 - len(PROMPT))
        with self.assertRaises(grpc.RpcError) as e:
            self.generate(max_tokens=64 + 2 - len(PROMPT))
        self.assertEqual(e.exception.code(), INVALID)
        self.assertRegex(e.exception.details(), r"^max_tokens.*context of 64 tokens")
        self.assertStillServing()


class CallCapTest(h.DaemonTestCase):
    # server.max_concurrent_calls = 2. Server reflection streams hold a call each for as long as
    # their client keeps them open, which makes a full cap easy to hold.
    SETTINGS = {"server.max_concurrent_calls": "2", "server.num_threads": "1"}

    def open_reflection_stream(self):
        """A reflection stream whose first request is answered (its handler runs and waits for
        the next); returns (requests queue, call). Put None in the queue to end it."""
        rpb = h.reflection_pb()
        requests = queue.Queue()

        def pending():
            while True:
                r = requests.get()
                if r is None:
                    return
                yield r

        call = self.daemon.channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=rpb.ServerReflectionRequest.SerializeToString,
            response_deserializer=rpb.ServerReflectionResponse.FromString)(
                pending(), timeout=h.RPC_TIMEOUT_S)
        requests.put(rpb.ServerReflectionRequest(list_services="*"))
        self.assertTrue(next(call).list_services_response.service)
        return requests, call

    def close(self, stream):
        requests, call = stream
        requests.put(None)
        for _ in call:  # to its status: the handler has returned
            pass

    def model_info(self):
        return self.daemon.stub.GetModelInfo(h.pb().GetModelInfoRequest(),
                                             timeout=h.RPC_TIMEOUT_S)

    def test_calls_past_the_cap_are_refused_at_once_and_health_still_answers(self):
        streams = [self.open_reflection_stream() for _ in range(2)]
        try:
            for refused in [self.model_info,
                            lambda: self.daemon.generate(request(max_tokens=4))]:
                with self.assertRaises(grpc.RpcError) as e:
                    refused()
                self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
                self.assertIn("Threadpool Exhausted", e.exception.details())
            self.assertEqual(self.daemon.health(), h.health_pb().HealthCheckResponse.SERVING)
            # A call that ends makes room (its thread goes back to gRPC's pool a moment after
            # the client has its status: until then a call may still be refused).
            self.close(streams.pop())
            deadline = time.monotonic() + 10 * h.TIME_SCALE
            while True:
                try:
                    self.assertEqual(self.model_info().name, "stories260K")
                    break
                except grpc.RpcError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
                    self.assertLess(time.monotonic(), deadline, "no room after a call ended")
                    time.sleep(0.01)
        finally:
            for stream in streams:
                self.close(stream)
        self.assertStillServing()


class QueueFullTest(h.DaemonTestCase):
    # One sequence at a time, one waiting: a burst of requests overflows the queue.
    SETTINGS = {"kv_cache_config.max_batch_size": "1", "server.max_waiting_requests": "1",
                "server.num_threads": "1"}
    NUM_REQUESTS = 10

    def test_full_waiting_queue_is_resource_exhausted_and_the_rest_complete(self):
        case = max(h.load_golden(), key=lambda c: len(c["output_tokens"]))
        calls = [self.daemon.stub.Generate(h.greedy_request(case), timeout=h.RPC_TIMEOUT_S)
                 for _ in range(self.NUM_REQUESTS)]
        rejected = 0
        for call in calls:
            try:
                tokens = [t for r in call for t in r.token_ids]
                self.assertEqual(tokens, case["output_tokens"])
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
                self.assertIn("queue", e.details())
                rejected += 1
        self.assertGreater(rejected, 0)
        self.assertLess(rejected, self.NUM_REQUESTS)
        self.assertEqual(self.daemon.cache_stats().requests_rejected, rejected)
        self.assertStillServing()


if __name__ == "__main__":
    h.main()
