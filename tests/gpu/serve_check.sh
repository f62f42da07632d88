#!/usr/bin/env bash
# The daemon on the GPU, end to end: starts `kvd serve --model synthetic:llama3-8b --device
# cuda` (weights made in device memory, a KV pool sized for 64 x 1024 tokens, decode steps
# replayed as CUDA graphs) on free ports, sends 16 concurrent greedy requests of 64 tokens
# with `kvd client --prompt-token-ids` (a synthetic model has no tokenizer), checks that
# every one finishes with finish_reason=length and 64 tokens, that a text prompt is refused
# naming the field, scrapes /metrics (tokens, and where the memory went), then SIGTERMs the
# daemon and checks it drains and exits 0. Prints one PASS/FAIL line per check and a summary;
# exit status 0 only when all passed. Bounded to about two minutes.
#
#   serve_check.sh KVD_BINARY OUT_DIR
set -uo pipefail

kvd="${1:?usage: serve_check.sh KVD_BINARY OUT_DIR}"
out="${2:?usage: serve_check.sh KVD_BINARY OUT_DIR}"
mkdir -p "$out/serve_check"
dir="$out/serve_check"
daemon_log="$dir/daemon.log"
failures=0
pid=""

pass() { echo "serve_check: PASS $*"; }
fail() {
  echo "serve_check: FAIL $*"
  failures=$((failures + 1))
}
# Stops the daemon on every way out. `timeout` (whose pid $pid is) leads its own process group
# with kvd in it: TERM to timeout is passed on to kvd (which drains), then whatever of the
# group is left after 10 s is killed outright, so no daemon outlives the check holding GPU
# memory and ports.
stop_daemon() {
  [[ -n "$pid" ]] || return 0
  if kill -0 "$pid" 2> /dev/null; then
    kill -TERM "$pid" 2> /dev/null
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2> /dev/null || break
      sleep 0.1
    done
  fi
  kill -KILL -- "-$pid" 2> /dev/null
  kill -KILL "$pid" 2> /dev/null
  wait "$pid" 2> /dev/null
  pid=""
}
finish() {
  stop_daemon
  if ((failures == 0)); then
    echo "serve_check: PASS (all checks)"
    exit 0
  fi
  echo "serve_check: FAIL ($failures checks failed; daemon log: $daemon_log)"
  tail -n 20 "$daemon_log" 2> /dev/null | sed 's/^/    daemon: /'
  exit 1
}
trap stop_daemon EXIT
trap 'fail "interrupted"; finish' INT TERM

# GET /metrics over bash's /dev/tcp (curl when present).
scrape() {
  local address="$1"
  if command -v curl > /dev/null; then
    curl -fsS --max-time 10 "http://$address/metrics"
    return
  fi
  exec 3<> "/dev/tcp/${address%:*}/${address##*:}" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n' "$address" >&3
  timeout 10 cat <&3
  exec 3>&-
}

timeout 150 "$kvd" serve --model synthetic:llama3-8b --device cuda \
  --grpc-address 127.0.0.1:0 --metrics-address 127.0.0.1:0 \
  --set kv_cache_config.max_batch_size=64 \
  --set kv_cache_config.max_seq_length=1024 \
  --set kv_cache_config.memory_pool.initial_size=8GiB \
  --set kv_cache_config.memory_pool.max_size=8GiB \
  --set server.drain_timeout=30s > "$daemon_log" 2>&1 &
pid=$!  # timeout's: it runs kvd as its child, in a process group of its own (pgid $pid)

# Startup: weights are generated on the device, so this takes seconds, not minutes.
for _ in $(seq 1 600); do
  grep -q '^kvd: serving metrics on' "$daemon_log" && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.1
done
grpc="$(sed -n 's/^kvd: serving gRPC on //p' "$daemon_log")"
metrics="$(sed -n 's|^kvd: serving metrics on http://\(.*\)/metrics$|\1|p' "$daemon_log")"
if [[ -z "$grpc" || -z "$metrics" ]]; then
  fail "startup: no 'serving' lines within 60 s"
  finish
fi
if grep -q 'backend cuda (GPU 0, decode graphs on), kv bf16' "$daemon_log"; then
  pass "startup: $(grep '^kvd: model' "$daemon_log")"
else
  fail "startup: expected 'backend cuda (GPU 0, decode graphs on), kv bf16' in the model line"
fi

# 16 concurrent requests, distinct prompts of 16..31 token ids, exactly 64 new tokens each.
declare -a clients
for i in $(seq 0 15); do
  ids="$(seq -s, $((100 + 37 * i)) 3 $((100 + 37 * i + 3 * (15 + i))))"
  timeout 90 "$kvd" client --address "$grpc" --prompt-token-ids "$ids" --max-tokens 64 \
    --ignore-eos --usage --timeout 80 > "$dir/client$i.out" 2> "$dir/client$i.err" &
  clients[i]=$!
done
ok=0
for i in $(seq 0 15); do
  if wait "${clients[i]}" && grep -q 'finish_reason=length' "$dir/client$i.err" &&
    grep -q 'completion_tokens=64 ' "$dir/client$i.err" &&
    [[ "$(wc -w < "$dir/client$i.out")" == 64 ]]; then
    ok=$((ok + 1))
  else
    echo "    client $i: $(tr '\n' ' ' < "$dir/client$i.err" | cut -c1-300)"
  fi
done
if ((ok == 16)); then
  pass "16 concurrent requests: all finished with finish_reason=length and 64 tokens"
else
  fail "16 concurrent requests: only $ok of 16 finished with finish_reason=length and 64 tokens"
fi

# No tokenizer: a text prompt is INVALID_ARGUMENT naming the field.
if "$kvd" client --address "$grpc" --prompt "hello" --max-tokens 4 --timeout 20 \
  > /dev/null 2> "$dir/text_prompt.err"; then
  fail "text prompt: accepted by a model without a tokenizer"
elif grep -q 'INVALID_ARGUMENT' "$dir/text_prompt.err" && grep -q 'prompt' "$dir/text_prompt.err"; then
  pass "text prompt: refused with INVALID_ARGUMENT naming the prompt"
else
  fail "text prompt: unexpected error: $(cat "$dir/text_prompt.err")"
fi

scrape "$metrics" > "$dir/metrics.txt" 2> "$dir/metrics.err"
generated="$(awk '$1 ~ /^kvd_generation_tokens/ { print $2 }' "$dir/metrics.txt" | head -n 1)"
if grep -q '^kvd_model_info' "$dir/metrics.txt" && [[ -n "$generated" ]] &&
  awk -v g="$generated" 'BEGIN { exit !(g >= 16 * 64) }'; then
  pass "metrics: kvd_generation_tokens $generated (>= 1024)"
else
  fail "metrics: scrape of http://$metrics/metrics lacks kvd_model_info or 1024 generated tokens"
fi

# Where the memory went: llama3-8b's 8,030,261,248 parameters in bf16, the KV pool's chunks,
# and the GPU's own total and free memory, which must have room for what kvd says it holds.
series() { awk -v k="$1" '$1 == k { print $2 }' "$dir/metrics.txt" | head -n 1; }
weights="$(series 'kvd_memory_bytes{component="weights"}')"
kv_pool="$(series 'kvd_memory_bytes{component="kv_pool"}')"
reserved="$(series kvd_kv_pool_reserved_bytes)"
activations="$(series 'kvd_memory_bytes{component="activations"}')"
workspace="$(series 'kvd_memory_bytes{component="workspace"}')"
total="$(series 'kvd_device_memory_bytes{state="total"}')"
free="$(series 'kvd_device_memory_bytes{state="free"}')"
grep '^kvd: memory:' "$daemon_log" | sed 's/^/serve_check: /'
# After serving, the workspace is cuBLASLt's 32 MiB plus op scratch (1 MiB at least a buffer).
if [[ -n "$weights" && -n "$kv_pool" && -n "$reserved" && -n "$activations" && -n "$workspace" &&
  -n "$total" && -n "$free" ]] &&
  awk -v w="$weights" -v k="$kv_pool" -v r="$reserved" -v a="$activations" -v s="$workspace" \
    -v t="$total" -v f="$free" \
    'BEGIN { exit !(w == 16060522496 && k == r && k > 0 && a > 0 && s >= 34603008 && t > 0 &&
                    f > 0 && w + k + a + s + f <= t) }'; then
  pass "memory: weights $weights, kv_pool $kv_pool, activations $activations, workspace $workspace; device free $free of $total"
else
  fail "memory: weights '$weights' (want 16060522496), kv_pool '$kv_pool' (reserved '$reserved'), activations '$activations', workspace '$workspace', device total '$total' free '$free'"
fi

kill -TERM "$pid"
wait "$pid"
code=$?
pid=""
if ((code == 0)) && grep -q '^kvd: stopped' "$daemon_log"; then
  pass "SIGTERM: drained and exited 0"
else
  fail "SIGTERM: exit status $code (want 0 after 'kvd: stopped')"
fi
finish
