#!/usr/bin/env bash
# The daemon on the GPU, end to end: starts `kvd serve --model synthetic:llama3-8b --device
# cuda` (weights made in device memory, a KV pool sized for 64 x 1024 tokens, decode steps
# replayed as CUDA graphs) on free ports, sends 16 concurrent greedy requests of 64 tokens
# with `kvd client --prompt-token-ids` (a synthetic model has no tokenizer), checks that
# every one finishes with finish_reason=length and 64 tokens, that a text prompt is refused
# naming the field, scrapes /metrics (tokens, and where the memory went), then SIGTERMs the
# daemon and checks it drains and exits 0. Then, with all but 20 GiB of the GPU held by
# device_hog.py (beside this script), a second daemon whose pool may grow to 64 GiB: it must
# warn at startup that the device has no room for that, stop growing where a chunk would
# leave less than memory_pool.device_headroom free (a counted growth failure, its reason on
# stderr), and still finish 24 requests that together need more KV than it could get; once
# the hog lets go, the pool must grow again after memory_pool.growth_retry_interval.
# Prints one PASS/FAIL line per check and a summary; exit status 0 only when all passed.
# Bounded to about seven minutes (each wait has its own timeout); usually under three.
#
#   serve_check.sh KVD_BINARY OUT_DIR
set -uo pipefail

kvd="${1:?usage: serve_check.sh KVD_BINARY OUT_DIR}"
out="${2:?usage: serve_check.sh KVD_BINARY OUT_DIR}"
mkdir -p "$out/serve_check"
dir="$out/serve_check"
daemon_log="$dir/daemon.log"
first_log="$daemon_log"
failures=0
pid=""
hog=""

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
stop_hog() {
  [[ -n "$hog" ]] || return 0
  # $hog is `timeout`, which passes a SIGTERM on to device_hog.py and exits once it has; a
  # SIGKILL would kill `timeout` alone and leave device_hog.py holding the device's memory.
  kill -TERM "$hog" 2> /dev/null
  wait "$hog" 2> /dev/null
  hog=""
}
finish() {
  stop_daemon
  stop_hog
  if ((failures == 0)); then
    echo "serve_check: PASS (all checks)"
    exit 0
  fi
  echo "serve_check: FAIL ($failures checks failed; daemon log: $daemon_log)"
  tail -n 20 "$daemon_log" 2> /dev/null | sed 's/^/    daemon: /'
  if [[ "$daemon_log" != "$first_log" ]]; then
    echo "serve_check: (the first daemon's log: $first_log)"
  fi
  exit 1
}
trap 'stop_daemon; stop_hog' EXIT
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

# start_daemon LABEL SECONDS [--set KEY=VALUE ...]: `kvd serve` of synthetic:llama3-8b on the
# GPU, on free ports, for at most SECONDS, logging to $daemon_log; sets $pid, $grpc and
# $metrics once it serves (weights are generated on the device, so that takes seconds), or
# fails LABEL and finishes after 60 s without.
start_daemon() {
  local label="$1" seconds="$2"
  shift 2
  timeout "$seconds" "$kvd" serve --model synthetic:llama3-8b --device cuda \
    --grpc-address 127.0.0.1:0 --metrics-address 127.0.0.1:0 \
    --set server.drain_timeout=30s "$@" > "$daemon_log" 2>&1 &
  pid=$!  # timeout's: it runs kvd as its child, in a process group of its own (pgid $pid)
  for _ in $(seq 1 600); do
    grep -q '^kvd: serving metrics on' "$daemon_log" && break
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
  done
  grpc="$(sed -n 's/^kvd: serving gRPC on //p' "$daemon_log")"
  metrics="$(sed -n 's|^kvd: serving metrics on http://\(.*\)/metrics$|\1|p' "$daemon_log")"
  if [[ -z "$grpc" || -z "$metrics" ]]; then
    fail "$label: no 'serving' lines within 60 s"
    finish
  fi
}

# check_sigterm LABEL: SIGTERM to the daemon, which must drain and exit 0.
check_sigterm() {
  kill -TERM "$pid"
  wait "$pid"
  local code=$?
  pid=""
  if ((code == 0)) && grep -q '^kvd: stopped' "$daemon_log"; then
    pass "$1: drained and exited 0"
  else
    fail "$1: exit status $code (want 0 after 'kvd: stopped')"
  fi
}

start_daemon startup 150 \
  --set kv_cache_config.max_batch_size=64 \
  --set kv_cache_config.max_seq_length=1024 \
  --set kv_cache_config.memory_pool.initial_size=8GiB \
  --set kv_cache_config.memory_pool.max_size=8GiB
if grep -q 'backend cuda (GPU 0, decode graphs on), kv bf16' "$daemon_log"; then
  pass "startup: $(grep '^kvd: model' "$daemon_log")"
else
  fail "startup: expected 'backend cuda (GPU 0, decode graphs on), kv bf16' in the model line"
fi

# run_clients NAME COUNT MAX_TOKENS SECONDS PROMPT_FN: COUNT concurrent greedy requests to
# the daemon, request i's prompt the token ids `PROMPT_FN i` prints, each to generate exactly
# MAX_TOKENS within SECONDS; their output in $dir/NAMEi.out and .err. Sets $ok to how many
# finished with finish_reason=length and MAX_TOKENS tokens, and prints the others' errors.
run_clients() {
  local name="$1" count="$2" tokens="$3" seconds="$4" prompt="$5" i
  local -a pids
  for ((i = 0; i < count; ++i)); do
    timeout "$seconds" "$kvd" client --address "$grpc" --prompt-token-ids "$("$prompt" "$i")" \
      --max-tokens "$tokens" --ignore-eos --usage --timeout $((seconds - 10)) \
      > "$dir/$name$i.out" 2> "$dir/$name$i.err" &
    pids[i]=$!
  done
  ok=0
  for ((i = 0; i < count; ++i)); do
    if wait "${pids[i]}" && grep -q 'finish_reason=length' "$dir/$name$i.err" &&
      grep -q "completion_tokens=$tokens " "$dir/$name$i.err" &&
      [[ "$(wc -w < "$dir/$name$i.out")" == "$tokens" ]]; then
      ok=$((ok + 1))
    else
      echo "    $name $i: $(tr '\n' ' ' < "$dir/$name$i.err" | cut -c1-300)"
    fi
  done
}

# 16 concurrent requests, distinct prompts of 16..31 token ids, exactly 64 new tokens each.
short_prompt() { seq -s, $((100 + 37 * $1)) 3 $((100 + 37 * $1 + 3 * (15 + $1))); }
run_clients client 16 64 90 short_prompt
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
# series NAME [FILE]: the value of the series NAME (labels included) in FILE (default: the
# first daemon's scrape).
series() { awk -v k="$1" '$1 == k { print $2 }' "${2:-$dir/metrics.txt}" | head -n 1; }
weights="$(series 'kvd_memory_bytes{component="weights"}')"
kv_pool="$(series 'kvd_memory_bytes{component="kv_pool"}')"
reserved="$(series kvd_kv_pool_reserved_bytes)"
activations="$(series 'kvd_memory_bytes{component="activations"}')"
workspace="$(series 'kvd_memory_bytes{component="workspace"}')"
total="$(series 'kvd_device_memory_bytes{state="total"}')"
free="$(series 'kvd_device_memory_bytes{state="free"}')"
grep '^kvd: memory:' "$daemon_log" | sed 's/^/serve_check: /'
# After serving, the workspace is cuBLASLt's 32 MiB plus op scratch (1 MiB at least a buffer).
# The activations of a 2048-token step with 64 sampled rows are held from startup:
# 2048 x 172,032 + 64 x 529,408 = 386,203,648 bytes (LlamaModel::ActivationBytes), and a
# few buffers more.
if [[ -n "$weights" && -n "$kv_pool" && -n "$reserved" && -n "$activations" && -n "$workspace" &&
  -n "$total" && -n "$free" ]] &&
  awk -v w="$weights" -v k="$kv_pool" -v r="$reserved" -v a="$activations" -v s="$workspace" \
    -v t="$total" -v f="$free" \
    'BEGIN { exit !(w == 16060522496 && k == r && k > 0 && a >= 386203648 && s >= 34603008 && t > 0 &&
                    f > 0 && w + k + a + s + f <= t) }'; then
  pass "memory: weights $weights, kv_pool $kv_pool, activations $activations, workspace $workspace; device free $free of $total"
else
  fail "memory: weights '$weights' (want 16060522496), kv_pool '$kv_pool' (reserved '$reserved'), activations '$activations' (want >= 386203648), workspace '$workspace', device total '$total' free '$free'"
fi

check_sigterm SIGTERM

# --- A nearly full device: the pool stops growing at memory_pool.device_headroom. ---
# 20 GiB left: llama3-8b's 14.96 GiB of weights, the CUDA context and cuBLAS, the 1 GiB
# headroom, and a few GiB of KV (128 KiB a token), far under the 64 GiB max_size.
hog_log="$dir/device_hog.log"
# Bounded, so that a check killed outright leaves no memory held for what runs after it.
timeout 420 python3 "$(dirname "$0")/device_hog.py" 20480 > "$hog_log" 2>&1 &
hog=$!
for _ in $(seq 1 300); do
  grep -q '^device_hog: held' "$hog_log" 2> /dev/null && break
  kill -0 "$hog" 2> /dev/null || break
  sleep 0.1
done
if ! grep -q '^device_hog: held' "$hog_log"; then
  fail "headroom: device_hog.py did not take the device's memory: $(cat "$hog_log")"
  finish
fi
echo "serve_check: $(cat "$hog_log")"
daemon_log="$dir/daemon_headroom.log"
start_daemon headroom 200 \
  --set kv_cache_config.max_batch_size=32 \
  --set kv_cache_config.max_seq_length=2048 \
  --set kv_cache_config.memory_pool.initial_size=256MiB \
  --set kv_cache_config.memory_pool.max_size=64GiB \
  --set kv_cache_config.memory_pool.device_headroom=1GiB \
  --set kv_cache_config.memory_pool.growth_retry_interval=2s \
  --set kv_cache_config.defrag.enabled=false
if grep -q 'max_size lets the KV pool grow to 64.00 GiB, more than the device has room for' \
  "$daemon_log"; then
  pass "headroom: startup warns: $(grep -o 'room for: [^(]*' "$daemon_log")"
else
  fail "headroom: no startup warning that the device has no room for a 64 GiB pool"
fi
# 24 requests of 1536 prompt tokens and 256 new ones: 43,008 tokens, 5.25 GiB of KV at most.
long_prompt() { seq -s, $((1000 + 5000 * $1)) 3 $((1000 + 5000 * $1 + 3 * 1535)); }
run_clients headroom 24 256 150 long_prompt
if ((ok == 24)); then
  pass "headroom: 24 requests needing more KV than the device holds all finished with 256 tokens"
else
  fail "headroom: only $ok of 24 requests finished with finish_reason=length and 256 tokens"
fi
scrape "$metrics" > "$dir/metrics_headroom.txt" 2> "$dir/metrics_headroom.err"
failures_total="$(series kvd_kv_pool_growth_failures_total "$dir/metrics_headroom.txt")"
stopped="$(series kvd_kv_pool_growth_stopped "$dir/metrics_headroom.txt")"
reserved="$(series kvd_kv_pool_reserved_bytes "$dir/metrics_headroom.txt")"
free="$(series 'kvd_device_memory_bytes{state="free"}' "$dir/metrics_headroom.txt")"
if [[ -n "$failures_total" && -n "$reserved" && -n "$free" && "$stopped" == 1 ]] &&
  awk -v f="$failures_total" -v r="$reserved" 'BEGIN { exit !(f >= 1 && r < 64 * 2^30) }' &&
  grep -q 'would leave .* under the 1073741824 kept for the engine.s buffers' "$daemon_log"; then
  pass "headroom: pool stopped at $reserved bytes, $failures_total growth failures, device free $free: $(grep -m1 -o 'would leave [^(]*' "$daemon_log")"
else
  fail "headroom: growth failures '$failures_total', growth stopped '$stopped' (want 1), reserved '$reserved', free '$free'; the headroom's reason in the log: $(grep -c 'would leave' "$daemon_log")"
fi
# The hog lets go; an engine step past the 2 s growth_retry_interval tries a chunk again, and
# the pool grows as before: 32 requests of 1536 + 256 tokens (other prompts than the last
# ones, so no prefix hits) need 7 GiB of KV at most, more than the pool stopped at.
# Defragmentation is off in this daemon, so no chunk release lifts the stop instead.
released="$(series kvd_kv_pool_chunks_released_total "$dir/metrics_headroom.txt")"
stop_hog
sleep 3
regrow_prompt() { seq -s, $((2000 + 3000 * $1)) 2 $((2000 + 3000 * $1 + 2 * 1535)); }
run_clients regrow 32 256 150 regrow_prompt
scrape "$metrics" > "$dir/metrics_regrow.txt" 2> "$dir/metrics_regrow.err"
regrown="$(series kvd_kv_pool_reserved_bytes "$dir/metrics_regrow.txt")"
stopped="$(series kvd_kv_pool_growth_stopped "$dir/metrics_regrow.txt")"
if ((ok == 32)) && [[ -n "$regrown" && -n "$reserved" && "$released" == 0 && "$stopped" == 0 ]] &&
  awk -v a="$regrown" -v b="$reserved" 'BEGIN { exit !(a > b) }'; then
  pass "growth retry: with the device's memory back the pool grew from $reserved to $regrown bytes, 32/32 requests finished"
else
  fail "growth retry: pool at '$regrown' bytes after the hog let go (was '$reserved'; chunks released '$released', want 0; growth stopped '$stopped', want 0); $ok of 32 requests finished"
fi
check_sigterm "headroom: SIGTERM"
stop_hog
finish
