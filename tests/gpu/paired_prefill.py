#!/usr/bin/env python3
"""kvd's causal prefill attention against PyTorch SDPA's, call by call in alternation.

Separate processes run at different clocks: under the GPU's power cap the SM clock of one
process's rows differs from the next one's by 10% or more, wider than the gap the prefill
target (0.9x SDPA at 1 x 16k) measures. So this script starts `gpu_bench paired` (its line
protocol: PairedMain in gpu_bench.cc) and, for each prefill shape that offers, alternates one
kvd call and one SDPA call (is_causal, enable_gqa; 32 query heads, 8 KV heads, head_dim 128, bf16,
random data, as torch_peers.py), each between CUDA events and waited for, the order swapped
every pair. A pair's ratio is SDPA's time over kvd's (kvd's rate over SDPA's); a row gives
the median of the pairs' ratios with its quartiles, and each side's median time and rate.

Usage: paired_prefill.py GPU_BENCH OUT_JSON [PAIRS]   (PAIRS >= 1, default 31; 3 warm-up
calls a side come first). Writes a JSON list of rows and prints a line per shape. Exit
status 0 when every shape gave its pairs; 1 when gpu_bench failed or stopped early (what it
said is printed), or SDPA failed at a shape (its row then holds the error; the other shapes
are still measured); 2 on a usage error. Needs torch and a GPU; the pairing itself (run_pairs)
takes any callables, which is how paired_prefill_test.py checks it without them.
"""
import json
import os
import subprocess
import sys

HQ, HKV, D = 32, 8, 128
WARMUP = 3


class BenchError(Exception):
    """gpu_bench paired broke its protocol: exited, or said something unexpected."""


class PairedBench:
    """A running `gpu_bench paired` (or any command speaking its protocol)."""

    def __init__(self, command):
        env = dict(os.environ)
        env.pop("OUT", None)  # nothing of this run goes to a gpu_bench.json
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1, env=env)

    def _line(self, what):
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise BenchError(f"gpu_bench ended (exit status {code}) where {what} was due")
        return line.split()

    def next_shape(self):
        """(batch, rows, context) of the next shape, or None after the last."""
        words = self._line("a shape or done")
        if words == ["done"]:
            return None
        if len(words) != 4 or words[0] != "shape" or not all(w.isdigit() for w in words[1:]):
            raise BenchError(f"expected 'shape B ROWS CONTEXT' or 'done', got {' '.join(words)!r}")
        return tuple(int(w) for w in words[1:])

    def call(self):
        """Milliseconds of one kvd call."""
        self._send("call")
        words = self._line("a call's time")
        try:
            if len(words) == 2 and words[0] == "ms":
                return float(words[1])
        except ValueError:
            pass
        raise BenchError(f"expected 'ms X', got {' '.join(words)!r}")

    def skip(self):
        self._send("next")

    def close(self):
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def _send(self, line):
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise BenchError(f"gpu_bench stopped reading (exit status {self.proc.wait()})")


def quantile(sorted_values, q):
    """The value at index floor(q * n) of a sorted list of n (the median for odd n)."""
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run_pairs(ours, theirs, pairs, warmup=WARMUP):
    """Calls ours() and theirs() (each returns milliseconds) warmup times each, then pairs
    times each, alternately: pair i runs ours first for even i, theirs first for odd i.
    Returns (ours_ms, theirs_ms), lists of the paired calls' times in order."""
    for _ in range(warmup):
        ours()
        theirs()
    ours_ms, theirs_ms = [], []
    for i in range(pairs):
        if i % 2 == 0:
            ours_ms.append(ours())
            theirs_ms.append(theirs())
        else:
            theirs_ms.append(theirs())
            ours_ms.append(ours())
    return ours_ms, theirs_ms


def summarize(batch, rows, context, ours_ms, theirs_ms):
    """A JSON row for one shape from its paired times (kvd's, SDPA's)."""
    # Causal: the rows see on average (context - rows / 2) keys, as gpu_bench counts.
    flops = 4.0 * batch * rows * (context - rows / 2.0) * HQ * D
    ratios = sorted(t / o for o, t in zip(ours_ms, theirs_ms))
    ours_med = quantile(sorted(ours_ms), 0.5)
    theirs_med = quantile(sorted(theirs_ms), 0.5)
    return {
        "name": f"paired prefill causal B={batch} L={context}",
        "pairs": len(ratios),
        "kvd ms": round(ours_med, 4),
        "sdpa ms": round(theirs_med, 4),
        "kvd TFLOP/s": round(flops / ours_med / 1e9, 1),
        "sdpa TFLOP/s": round(flops / theirs_med / 1e9, 1),
        "ratio": round(quantile(ratios, 0.5), 4),
        "ratio q1": round(quantile(ratios, 0.25), 4),
        "ratio q3": round(quantile(ratios, 0.75), 4),
    }


def measure(bench, make_sdpa, pairs, out):
    """Every shape gpu_bench offers, paired with make_sdpa(batch, rows, context)'s calls, a row
    each appended to `out` as it is done. A shape whose SDPA side fails (e.g. out of memory)
    gets a row with its error instead, and the others are still measured. Returns how many
    failed; raises BenchError when gpu_bench breaks off."""
    failures = 0
    while (shape := bench.next_shape()) is not None:
        try:
            theirs = make_sdpa(*shape)
            ours_ms, theirs_ms = run_pairs(bench.call, theirs, pairs)
        except BenchError:
            raise
        except Exception as error:  # SDPA's side: this shape only
            name = "paired prefill causal B={} L={}".format(shape[0], shape[2])
            print(f"paired_prefill.py: {name}: SDPA failed: {error}", file=sys.stderr)
            out.append({"name": name, "error": str(error)[:200]})
            failures += 1
            bench.skip()
            continue
        row = summarize(*shape, ours_ms, theirs_ms)
        print(f"{row['name']:<36} kvd {row['kvd ms']:8.4f} ms {row['kvd TFLOP/s']:6.1f} TFLOP/s"
              f"  sdpa {row['sdpa ms']:8.4f} ms {row['sdpa TFLOP/s']:6.1f} TFLOP/s  "
              f"kvd/sdpa {row['ratio']:.3f} (quartiles {row['ratio q1']:.3f}-"
              f"{row['ratio q3']:.3f}, {row['pairs']} pairs)", flush=True)
        out.append(row)
        del theirs
        bench.skip()
    return failures


def torch_sdpa(batch, rows, context):
    """A callable timing one SDPA call at the shape (random bf16 data, as torch_peers.py)."""
    import torch
    import torch.nn.functional as F

    q = torch.randn(batch, HQ, rows, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, HKV, context, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, HKV, context, D, device="cuda", dtype=torch.bfloat16)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)

    def call():
        start.record()
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    return call


def main(argv, make_sdpa=torch_sdpa):
    if len(argv) not in (3, 4) or (len(argv) == 4 and not (argv[3].isdigit() and
                                                            int(argv[3]) >= 1)):
        print("usage: paired_prefill.py GPU_BENCH OUT_JSON [PAIRS]   (PAIRS >= 1, default 31)",
              file=sys.stderr)
        return 2
    pairs = int(argv[3]) if len(argv) == 4 else 31
    if make_sdpa is torch_sdpa:
        import torch

        torch.manual_seed(0)
    bench = PairedBench([argv[1], "paired"])
    rows, status = [], 0
    try:
        if measure(bench, make_sdpa, pairs, rows) > 0:
            status = 1
    except BenchError as error:
        print(f"paired_prefill.py: {error}", file=sys.stderr)
        status = 1
    finally:
        code = bench.close()
    if status == 0 and code != 0:
        print(f"paired_prefill.py: gpu_bench exit status {code}", file=sys.stderr)
        status = 1
    if status == 0 and not rows:
        print("paired_prefill.py: gpu_bench offered no shape", file=sys.stderr)
        status = 1
    with open(argv[2], "w") as f:
        json.dump(rows, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
