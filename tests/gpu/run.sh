#!/usr/bin/env bash
# Runs the GPU tests (and, when present, gpu_bench, the engine tests gpu_engine_test, the
# daemon check serve_check.sh (`kvd serve --device cuda` driven by `kvd client`), the
# end-to-end decode benchmark `kvd bench` and ../shared/peers/torch_peers.py, then
# compare_peers.py: kvd's attention rows beside SDPA's, and paired_prefill.py: kvd's prefill
# calls alternating with SDPA's, pair by pair; and decode_fit.py on gpu_bench's decode rows: a
# call's fixed cost and steady rate) on a GPU machine, writing logs and JSON under $OUT
# (default: ./gpu-out beside this script).
#
# From a bundle folder made by scripts/gpu-bundle:   BUNDLE/run.sh
# From a build tree:                                 BUILD=build tests/gpu/run.sh
# Extra arguments go to gpu_test (e.g. --gtest_filter='*Decode*').
# RUN_BENCH=0 skips gpu_bench and `kvd bench` (RUN_E2E=0 only the latter); RUN_ENGINE=0
# skips gpu_engine_test; RUN_SERVE=0 skips serve_check.sh; RUN_PEERS=0 skips torch_peers.py,
# the alternating rounds (PEER_ROUNDS, default 3, of `gpu_bench decode`, `gpu_bench prefill`
# and sdpa_shapes.py; compare_peers.py --rounds; 0 skips them) and paired_prefill.py (which
# RUN_BENCH=0 skips too). The RUN_* knobs are
# 0 or 1 and PEER_ROUNDS a whole number >= 0; any other value is a usage error (exit 2) before
# anything runs.
#
# Every output of every step is deleted first, so what $OUT holds afterwards was written by
# this run (compare_peers.py never reads an earlier run's JSON). The last lines are a summary,
# one line per part: PASS, FAIL (with the exit status) or SKIP (with why: not built, turned
# off, no PyTorch). Exit status: non-zero when one of kvd's programs failed (gpu_test,
# gpu_bench including its runs in the rounds, gpu_engine_test, serve_check.sh, `kvd bench`:
# an error, a crash, non-finite logits, graphs never replayed; never a time), gpu_test is
# missing, or gpu_test or gpu_engine_test skipped every test. The peer steps (torch_peers.py, sdpa_shapes.py, compare_peers.py, and
# paired_prefill.py, which runs gpu_bench itself) and decode_fit.py are informational: a
# failure is listed as FAIL in the summary but leaves the exit status alone, as a missing
# PyTorch does.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -f "$here/env.sh" ]]; then
  # shellcheck source=/dev/null
  source "$here/env.sh"
  bin="$here/bin"
  kvd_bin="$here/bin/kvd"
  peers="$here/shared/peers/torch_peers.py"
  compare_peers="$here/compare_peers.py"
  sdpa_shapes="$here/sdpa_shapes.py"
  paired_prefill="$here/paired_prefill.py"
  decode_fit="$here/decode_fit.py"
else
  root="$(cd "$here/../.." && pwd)"
  build="${BUILD:-build}"
  [[ "$build" = /* ]] || build="$root/$build"
  bin="$build/tests/gpu"
  kvd_bin="$build/server/kvd"
  peers="$root/../shared/peers/torch_peers.py"
  compare_peers="$root/tests/gpu/compare_peers.py"
  sdpa_shapes="$root/tests/gpu/sdpa_shapes.py"
  paired_prefill="$root/tests/gpu/paired_prefill.py"
  decode_fit="$root/tests/gpu/decode_fit.py"
fi

# The numeric knobs, checked before anything runs or is deleted: a bad value would otherwise
# abort mid-run under set -u ("abc: unbound variable") or be read as octal ("08").
usage_error() {  # usage_error VAR VALUE ALLOWED
  echo "run.sh: $1='$2': expected $3" >&2
  exit 2
}
for knob in RUN_BENCH RUN_E2E RUN_ENGINE RUN_SERVE RUN_PEERS; do
  value="${!knob:-1}"
  [[ "$value" == 0 || "$value" == 1 ]] || usage_error "$knob" "$value" "0 (skip) or 1 (run)"
done
rounds="${PEER_ROUNDS:-3}"
[[ "$rounds" =~ ^[0-9]{1,6}$ ]] ||
  usage_error PEER_ROUNDS "$rounds" "a whole number of rounds >= 0 (0 skips them)"
rounds=$((10#$rounds))

export OUT="${OUT:-$here/gpu-out}"
mkdir -p "$OUT"

# Everything the steps below write under $OUT, removed before any runs.
outputs=(nvidia-smi.txt gpu_test.json gpu_test.log gpu_bench.json gpu_bench.log
  gpu_engine_test.json gpu_engine_test.log serve_check serve_check.log kvd_bench.log
  kvd_bench.jsonl torch_peers.json torch_peers.log compare_peers.txt rounds
  compare_peers_rounds.txt paired_prefill.json paired_prefill.log decode_fit.txt)
for output in "${outputs[@]}"; do rm -rf "${OUT:?}/$output"; done

command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader | tee "$OUT/nvidia-smi.txt"

# The summary: one "NAME|CODE|KIND" entry per part, CODE an exit status or "skip" (KIND then
# says why). A failed kvd part sets the run's exit status (the first failure's); a failed peer
# or info (informational) part is reported only.
status=0
declare -a parts=()
record() {  # record NAME CODE [kvd|peer|info]
  parts+=("$1|$2|${3:-kvd}")
  if [[ ${3:-kvd} == kvd && $2 != 0 && $status == 0 ]]; then status=$2; fi
}
skip() { parts+=("$1|skip|$2"); }  # skip NAME WHY
have_torch() { python3 -c 'import torch' 2> /dev/null; }
# Why a step that sets gpu_bench beside PyTorch through SCRIPT cannot run, printed (nothing
# when it can): RUN_BENCH=0, RUN_PEERS=0, NO_ROUNDS where given (the rounds' own knob at 0),
# gpu_bench not built, SCRIPT missing, no PyTorch; the first that applies.
bench_peer_blocker() {  # bench_peer_blocker SCRIPT [NO_ROUNDS]
  if [[ "${RUN_BENCH:-1}" == 0 ]]; then
    echo "RUN_BENCH=0"
  elif [[ "${RUN_PEERS:-1}" == 0 ]]; then
    echo "RUN_PEERS=0"
  elif [[ -n "${2:-}" && "$rounds" -le 0 ]]; then
    echo "$2"
  elif [[ ! -x "$bin/gpu_bench" ]]; then
    echo "gpu_bench not built"
  elif [[ ! -f "$1" ]]; then
    echo "$(basename "$1") missing"
  elif ! have_torch; then
    echo "no PyTorch"
  fi
}

# summarize NAME: totals from $OUT/NAME.json, then each failure with its first message line.
summarize() {
  if command -v python3 > /dev/null && [[ -f "$OUT/$1.json" ]]; then
    python3 - "$OUT/$1.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
failed = []
skipped = 0
for suite in report.get("testsuites", []):
    for test in suite.get("testsuite", []):
        if test.get("result") == "SKIPPED" or test.get("status") == "NOTRUN":
            skipped += 1
        if test.get("failures"):
            message = test["failures"][0].get("failure", "").strip().splitlines()
            failed.append((suite["name"] + "." + test["name"], message[:3]))
print(f"== summary: {report.get('tests', 0)} tests, {len(failed)} failed, {skipped} skipped, "
      f"{report.get('time', '?')}")
for name, message in failed:
    print(f"FAILED {name}")
    for line in message:
        print(f"    {line}")
PY
  else
    grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$1.log" || true
  fi
}

# gtest_status NAME STATUS: STATUS, or 1 where it is 0 but every test of $OUT/NAME.json was
# skipped (the tests skip where no GPU is visible, say a driver too old for the runtime: such
# a run tested nothing).
gtest_status() {
  if [[ $2 == 0 ]] && command -v python3 > /dev/null && [[ -f "$OUT/$1.json" ]] &&
    python3 - "$OUT/$1.json" <<'PY'; then
import json, sys
report = json.load(open(sys.argv[1]))
tests = [t for s in report.get("testsuites", []) for t in s.get("testsuite", [])]
ran = [t for t in tests if t.get("result") != "SKIPPED" and t.get("status") != "NOTRUN"]
sys.exit(0 if tests and not ran else 1)
PY
    echo "$1: every test was skipped (no GPU visible to it?): counted as a failure" >&2
    echo 1
  else
    echo "$2"
  fi
}

echo "== gpu_test"
if [[ -x "$bin/gpu_test" ]]; then
  "$bin/gpu_test" --gtest_output="json:$OUT/gpu_test.json" "$@" 2>&1 | tee "$OUT/gpu_test.log"
  test_status=${PIPESTATUS[0]}
  summarize gpu_test
  test_status=$(gtest_status gpu_test "$test_status")
  echo "gpu_test exit status $test_status"
  record gpu_test "$test_status"
else
  # Not a skip: without gpu_test the run tests nothing.
  echo "gpu_test: $bin/gpu_test not built"
  parts+=("gpu_test|127|not built")
  status=127
fi

if [[ "${RUN_BENCH:-1}" == 0 ]]; then
  skip gpu_bench "RUN_BENCH=0"
elif [[ ! -x "$bin/gpu_bench" ]]; then
  skip gpu_bench "not built"
else
  echo "== gpu_bench"
  "$bin/gpu_bench" 2>&1 | tee "$OUT/gpu_bench.log"
  bench_status=${PIPESTATUS[0]}
  echo "gpu_bench exit status $bench_status"
  record gpu_bench "$bench_status"
fi
# Decode attention's fixed cost a call and steady rate, fitted over gpu_bench's shapes
# (informational), from this run's gpu_bench.json only (deleted above).
if [[ ! -f "$OUT/gpu_bench.json" ]]; then
  skip "decode fit" "needs gpu_bench.json from this run"
elif [[ ! -f "$decode_fit" ]]; then
  skip "decode fit" "decode_fit.py missing"
else
  echo "== decode attention: fixed cost a call and steady rate"
  python3 "$decode_fit" "$OUT/gpu_bench.json" 2>&1 | tee "$OUT/decode_fit.txt"
  record "decode fit" "${PIPESTATUS[0]}" info
fi
if [[ "${RUN_ENGINE:-1}" == 0 ]]; then
  skip gpu_engine_test "RUN_ENGINE=0"
elif [[ ! -x "$bin/gpu_engine_test" ]]; then
  skip gpu_engine_test "not built"
else
  echo "== gpu_engine_test"
  "$bin/gpu_engine_test" --gtest_output="json:$OUT/gpu_engine_test.json" 2>&1 |
    tee "$OUT/gpu_engine_test.log"
  engine_status=${PIPESTATUS[0]}
  summarize gpu_engine_test
  engine_status=$(gtest_status gpu_engine_test "$engine_status")
  echo "gpu_engine_test exit status $engine_status"
  record gpu_engine_test "$engine_status"
fi
if [[ "${RUN_SERVE:-1}" == 0 ]]; then
  skip serve_check "RUN_SERVE=0"
elif [[ ! -x "$kvd_bin" ]]; then
  skip serve_check "kvd not built"
elif [[ ! -f "$here/serve_check.sh" ]]; then
  skip serve_check "serve_check.sh missing"
else
  echo "== serve_check"
  bash "$here/serve_check.sh" "$kvd_bin" "$OUT" 2>&1 | tee "$OUT/serve_check.log"
  serve_status=${PIPESTATUS[0]}
  echo "serve_check exit status $serve_status"
  record serve_check "$serve_status"
fi
if [[ "${RUN_BENCH:-1}" == 0 ]]; then
  skip "kvd bench" "RUN_BENCH=0"
elif [[ "${RUN_E2E:-1}" == 0 ]]; then
  skip "kvd bench" "RUN_E2E=0"
elif [[ ! -x "$kvd_bin" ]]; then
  skip "kvd bench" "kvd not built"
else
  echo "== kvd bench"
  # Every case twice: decode steps uncaptured, then replayed as CUDA graphs.
  timeout 480 "$kvd_bin" bench --device cuda --graphs both 2>&1 | tee "$OUT/kvd_bench.log"
  e2e_status=${PIPESTATUS[0]}
  echo "kvd bench exit status $e2e_status"
  record "kvd bench" "$e2e_status"
fi
if [[ "${RUN_PEERS:-1}" == 0 ]]; then
  skip torch_peers "RUN_PEERS=0"
elif [[ ! -f "$peers" ]]; then
  skip torch_peers "$peers missing"
elif ! have_torch; then
  skip torch_peers "no PyTorch"
else
  echo "== torch_peers.py"
  python3 "$peers" 2>&1 | tee "$OUT/torch_peers.log"
  record torch_peers "${PIPESTATUS[0]}" peer
fi
# kvd's attention rows beside SDPA's at the same shapes (informational), from this run's files
# only: both were deleted above, so they exist only if written since.
if [[ -f "$OUT/gpu_bench.json" && -f "$OUT/torch_peers.json" ]]; then
  echo "== kvd vs SDPA"
  python3 "$compare_peers" "$OUT/gpu_bench.json" "$OUT/torch_peers.json" 2>&1 |
    tee "$OUT/compare_peers.txt"
  record compare_peers "${PIPESTATUS[0]}" peer
else
  skip compare_peers "needs gpu_bench.json and torch_peers.json from this run"
fi
# Then PEER_ROUNDS (default 3) rounds of kvd's decode and prefill rows each followed by SDPA's
# at the same shapes, compared by their medians over rounds (informational too, but a failed
# gpu_bench in them fails the run as gpu_bench's own step does). $rounds was checked above.
blocker="$(bench_peer_blocker "$sdpa_shapes" "PEER_ROUNDS=$rounds")"
if [[ -n "$blocker" ]]; then
  skip "peer rounds" "$blocker"
else
  echo "== kvd vs SDPA, $rounds rounds alternating"
  rounds_bench_status=0
  rounds_sdpa_status=0
  for ((round = 1; round <= rounds; round++)); do
    dir="$OUT/rounds/$round"
    for mode in decode prefill; do  # each writes its own $OUT/gpu_bench.json
      mkdir -p "$dir/$mode"
      OUT="$dir/$mode" "$bin/gpu_bench" "$mode" > "$dir/$mode/gpu_bench.log" 2>&1
      code=$?
      if [[ $code != 0 ]]; then
        echo "round $round: gpu_bench $mode exit status $code (log: $dir/$mode/gpu_bench.log)"
        [[ $rounds_bench_status == 0 ]] && rounds_bench_status=$code
      fi
    done
    python3 "$sdpa_shapes" "$dir/sdpa.json" > "$dir/sdpa.log" 2>&1
    code=$?
    if [[ $code != 0 ]]; then
      echo "round $round: sdpa_shapes.py exit status $code (log: $dir/sdpa.log)"
      [[ $rounds_sdpa_status == 0 ]] && rounds_sdpa_status=$code
    fi
  done
  record "gpu_bench (rounds)" "$rounds_bench_status"
  record "sdpa_shapes (rounds)" "$rounds_sdpa_status" peer
  python3 "$compare_peers" --rounds "$OUT/rounds" 2>&1 | tee "$OUT/compare_peers_rounds.txt"
  record "compare_peers (rounds)" "${PIPESTATUS[0]}" peer
fi
# kvd's prefill calls and SDPA's alternating in pairs, each pair at the same clocks
# (informational; paired_prefill.py).
blocker="$(bench_peer_blocker "$paired_prefill")"
if [[ -n "$blocker" ]]; then
  skip "paired prefill" "$blocker"
else
  echo "== kvd vs SDPA prefill, call by call in pairs"
  python3 "$paired_prefill" "$bin/gpu_bench" "$OUT/paired_prefill.json" 2>&1 |
    tee "$OUT/paired_prefill.log"
  record "paired prefill" "${PIPESTATUS[0]}" peer
fi
echo "== summary"
for part in "${parts[@]}"; do
  IFS='|' read -r name code kind <<< "$part"
  if [[ $code == skip ]]; then
    echo "SKIP $name ($kind)"
  elif [[ $code == 0 ]]; then
    echo "PASS $name"
  elif [[ $kind == peer ]]; then
    echo "FAIL $name (exit status $code; a peer step: reported, the exit status is kvd's)"
  elif [[ $kind == info ]]; then
    echo "FAIL $name (exit status $code; informational: reported, the exit status is kvd's)"
  elif [[ $kind == kvd ]]; then
    echo "FAIL $name (exit status $code)"
  else
    echo "FAIL $name ($kind)"
  fi
done
echo "== $([[ $status == 0 ]] && echo PASS || echo FAIL) (exit status $status)"
exit "$status"
