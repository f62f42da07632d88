"""Greedy outputs over gRPC equal llama2.c's reference (golden file), token for token, and
stay identical when 64 streams share the engine, also under preemption (batch invariance)."""

import concurrent.futures
import threading

import kvd_harness as h

NUM_STREAMS = 64


def run_streams(daemon, cases, num_streams):
    """Starts num_streams Generate calls at once (golden cases cycled), one thread each, and
    returns [(case index, token ids, finish reason)] in stream order."""
    start = threading.Barrier(num_streams)

    def one(i):
        case_index = i % len(cases)
        start.wait(timeout=h.RPC_TIMEOUT_S)
        tokens, _, last = daemon.generate(h.greedy_request(cases[case_index]))
        return case_index, tokens, last.finish_reason

    with concurrent.futures.ThreadPoolExecutor(max_workers=num_streams) as pool:
        return list(pool.map(one, range(num_streams)))


def check_greedy_outputs(test):
    """Every golden case's greedy output, finish reason and usage over gRPC."""
    for i, case in enumerate(h.load_golden()):
        with test.subTest(case=i, prompt=case["prompt"], max_tokens=case["max_new_tokens"]):
            tokens, _, last = test.daemon.generate(h.greedy_request(case))
            test.assertEqual(tokens, case["output_tokens"])
            test.assertEqual(last.finish_reason, h.expected_finish_reason(case))
            test.assertEqual(last.usage.prompt_tokens, len(case["prompt_tokens"]))
            test.assertEqual(last.usage.completion_tokens, len(case["output_tokens"]))


def check_text_prompt(test):
    """A text prompt is tokenized with BOS as llama2.c does and completed greedily."""
    case = h.load_golden()[0]
    tokens, text, last = test.daemon.generate(
        h.pb().GenerateRequest(prompt=case["prompt"], max_tokens=40, temperature=0.0))
    test.assertEqual(last.usage.prompt_tokens, len(case["prompt_tokens"]))
    test.assertEqual(tokens, case["output_tokens"][:40])
    test.assertTrue(case["completion_text"].startswith(text), text)


class GoldenTest(h.DaemonTestCase):
    # A batch wide enough that 64 streams really run together.
    SETTINGS = {"kv_cache_config.max_batch_size": "32"}

    def test_greedy_output_equals_llama2c_reference(self):
        check_greedy_outputs(self)

    def test_text_prompt_is_tokenized_with_bos_like_llama2c(self):
        check_text_prompt(self)

    def test_64_concurrent_streams_each_equal_their_solo_output(self):
        cases = h.load_golden()
        solo = [self.daemon.generate(h.greedy_request(c)) for c in cases]
        for case_index, tokens, reason in run_streams(self.daemon, cases, NUM_STREAMS):
            with self.subTest(case=case_index):
                self.assertEqual(tokens, solo[case_index][0])
                self.assertEqual(reason, solo[case_index][2].finish_reason)
        stats = self.daemon.idle_stats()
        self.assertEqual(stats.used_blocks, 0)


class GgufGoldenTest(h.DaemonTestCase):
    """The GGUF copy of stories260K (weights and tokenizer in one file) serves the same
    greedy outputs; its completions end at EOS, so the golden requests' stop at BOS is the
    request's own (stop_token_ids)."""
    MODEL = h.Paths.gguf_model

    def test_greedy_output_equals_llama2c_reference(self):
        check_greedy_outputs(self)

    def test_text_prompts_use_the_files_tokenizer(self):
        check_text_prompt(self)

    def test_model_info_comes_from_the_file(self):
        info = self.daemon.stub.GetModelInfo(h.pb().GetModelInfoRequest(),
                                             timeout=h.RPC_TIMEOUT_S)
        self.assertEqual((info.name, info.num_layers, info.num_kv_heads, info.vocab_size),
                         ("stories260K", 5, 4, 512))
        self.assertEqual((info.bos_token_id, info.eos_token_id), (1, 2))
        self.assertEqual(list(info.end_token_ids), [2])  # a GGUF model ends at EOS alone

    def test_a_completion_does_not_end_at_bos_unless_asked(self):
        case = next(c for c in h.load_golden() if c["stop"] == "bos")
        n = len(case["output_tokens"])
        tokens, _, last = self.daemon.generate(
            h.greedy_request(case, stop_token_ids=[], max_tokens=n + 4))
        self.assertEqual(tokens[:n + 1], case["output_tokens"] + [h.BOS_TOKEN_ID])


class PreemptionTest(h.DaemonTestCase):
    # About 64 blocks of 16 tokens for up to 32 sequences of up to 512 tokens each (33 blocks),
    # admitted on their prompt alone: growth must preempt. Prefix caching off, so that each
    # stream really needs its own blocks.
    SETTINGS = {
        "kv_cache_config.max_batch_size": "32",
        "kv_cache_config.memory_pool.initial_size": "1280KiB",
        "kv_cache_config.memory_pool.max_size": "1280KiB",
        "kv_cache_config.enable_prefix_caching": "false",
        "scheduler.admission_policy": "optimistic",
    }

    def test_64_streams_with_preemption_equal_the_golden_outputs(self):
        cases = h.load_golden()
        stats = self.daemon.cache_stats()
        self.assertLessEqual(stats.max_blocks, 70, "the pool is meant to be tiny: %s" % stats)
        # Every golden sequence fits the pool alone (prompt + output <= 513 tokens).
        self.assertGreaterEqual(stats.max_blocks * stats.block_size, 513)

        results = run_streams(self.daemon, cases, NUM_STREAMS)

        for case_index, tokens, reason in results:
            with self.subTest(case=case_index):
                self.assertEqual(tokens, cases[case_index]["output_tokens"])
                self.assertEqual(reason, h.expected_finish_reason(cases[case_index]))
        stats = self.daemon.idle_stats()
        self.assertGreater(stats.preemptions, 0, "no preemption happened: %s" % stats)
        self.assertEqual(stats.used_blocks, 0)
        metrics = self.daemon.metrics_text()
        self.assertRegex(metrics, r"(?m)^kvd_preemptions_total [1-9]")


if __name__ == "__main__":
    h.main()
