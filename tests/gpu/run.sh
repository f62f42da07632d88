#!/usr/bin/env bash
# Runs the GPU tests (and, when present, gpu_bench, the engine tests gpu_engine_test, the
# daemon check serve_check.sh (`kvd serve --device cuda` driven by `kvd client`), the
# end-to-end decode benchmark kvd_e2e_bench and ../shared/peers/torch_peers.py, then
# compare_peers.py: kvd's attention rows beside SDPA's) on a GPU machine, writing logs and JSON
# under $OUT (default: ./gpu-out beside this script).
#
# From a bundle folder made by scripts/gpu-bundle:   BUNDLE/run.sh
# From a build tree:                                 BUILD=build tests/gpu/run.sh
# Extra arguments go to gpu_test (e.g. --gtest_filter='*Decode*').
# RUN_BENCH=0 skips gpu_bench and kvd_e2e_bench (RUN_E2E=0 only the latter); RUN_ENGINE=0
# skips gpu_engine_test; RUN_SERVE=0 skips serve_check.sh; RUN_PEERS=0 skips torch_peers.py
# and the alternating rounds (PEER_ROUNDS, default 3, of `gpu_bench decode`, `gpu_bench
# prefill` and sdpa_shapes.py; compare_peers.py --rounds; 0 skips them). Exit status: non-zero
# when gpu_test, gpu_engine_test, serve_check.sh or kvd_e2e_bench (engine failure,
# non-finite logits or graphs never replayed; never a time) failed. The last lines are a
# PASS/FAIL summary per part.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -f "$here/env.sh" ]]; then
  # shellcheck source=/dev/null
  source "$here/env.sh"
  bin="$here/bin"
  bench_bin="$here/bin"
  kvd_bin="$here/bin/kvd"
  peers="$here/shared/peers/torch_peers.py"
  compare_peers="$here/compare_peers.py"
  sdpa_shapes="$here/sdpa_shapes.py"
else
  root="$(cd "$here/../.." && pwd)"
  build="${BUILD:-build}"
  [[ "$build" = /* ]] || build="$root/$build"
  bin="$build/tests/gpu"
  bench_bin="$build/bench"
  kvd_bin="$build/server/kvd"
  peers="$root/../shared/peers/torch_peers.py"
  compare_peers="$root/tests/gpu/compare_peers.py"
  sdpa_shapes="$root/tests/gpu/sdpa_shapes.py"
fi
export OUT="${OUT:-$here/gpu-out}"
mkdir -p "$OUT"

command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader | tee "$OUT/nvidia-smi.txt"

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

echo "== gpu_test"
"$bin/gpu_test" --gtest_output="json:$OUT/gpu_test.json" "$@" 2>&1 | tee "$OUT/gpu_test.log"
status=${PIPESTATUS[0]}

summarize gpu_test
echo "gpu_test exit status $status"
declare -a parts=("gpu_test $status")

if [[ "${RUN_BENCH:-1}" != 0 && -x "$bin/gpu_bench" ]]; then
  echo "== gpu_bench"
  "$bin/gpu_bench" 2>&1 | tee "$OUT/gpu_bench.log"
fi
if [[ "${RUN_ENGINE:-1}" != 0 && -x "$bin/gpu_engine_test" ]]; then
  echo "== gpu_engine_test"
  "$bin/gpu_engine_test" --gtest_output="json:$OUT/gpu_engine_test.json" 2>&1 |
    tee "$OUT/gpu_engine_test.log"
  engine_status=${PIPESTATUS[0]}
  summarize gpu_engine_test
  echo "gpu_engine_test exit status $engine_status"
  parts+=("gpu_engine_test $engine_status")
  [[ $engine_status != 0 ]] && status=$engine_status
fi
if [[ "${RUN_SERVE:-1}" != 0 && -x "$kvd_bin" && -f "$here/serve_check.sh" ]]; then
  echo "== serve_check"
  bash "$here/serve_check.sh" "$kvd_bin" "$OUT" 2>&1 | tee "$OUT/serve_check.log"
  serve_status=${PIPESTATUS[0]}
  echo "serve_check exit status $serve_status"
  parts+=("serve_check $serve_status")
  [[ $serve_status != 0 && $status == 0 ]] && status=$serve_status
fi
if [[ "${RUN_BENCH:-1}" != 0 && "${RUN_E2E:-1}" != 0 && -x "$bench_bin/kvd_e2e_bench" ]]; then
  echo "== kvd_e2e_bench"
  # Every case twice: decode steps uncaptured, then replayed as CUDA graphs.
  timeout 480 "$bench_bin/kvd_e2e_bench" --device cuda --graphs both 2>&1 |
    tee "$OUT/kvd_e2e_bench.log"
  e2e_status=${PIPESTATUS[0]}
  echo "kvd_e2e_bench exit status $e2e_status"
  parts+=("kvd_e2e_bench $e2e_status")
  [[ $e2e_status != 0 && $status == 0 ]] && status=$e2e_status
fi
if [[ "${RUN_PEERS:-1}" != 0 && -f "$peers" ]] && python3 -c 'import torch' 2> /dev/null; then
  echo "== torch_peers.py"
  python3 "$peers" 2>&1 | tee "$OUT/torch_peers.log"
fi
# kvd's attention rows beside SDPA's at the same shapes (informational: never a failure).
if [[ -f "$OUT/gpu_bench.json" && -f "$OUT/torch_peers.json" ]]; then
  echo "== kvd vs SDPA"
  python3 "$compare_peers" "$OUT/gpu_bench.json" "$OUT/torch_peers.json" 2>&1 |
    tee "$OUT/compare_peers.txt"
fi
# Then PEER_ROUNDS (default 3) rounds of kvd's decode and prefill rows each followed by SDPA's
# at the same shapes, compared by their medians over rounds (informational too).
rounds="${PEER_ROUNDS:-3}"
if [[ "${RUN_BENCH:-1}" != 0 && "${RUN_PEERS:-1}" != 0 && "$rounds" -gt 0 && -x "$bin/gpu_bench" &&
      -f "$sdpa_shapes" ]] && python3 -c 'import torch' 2> /dev/null; then
  echo "== kvd vs SDPA, $rounds rounds alternating"
  rm -rf "$OUT/rounds"
  for ((round = 1; round <= rounds; round++)); do
    dir="$OUT/rounds/$round"
    for mode in decode prefill; do  # each writes its own $OUT/gpu_bench.json
      mkdir -p "$dir/$mode"
      OUT="$dir/$mode" "$bin/gpu_bench" "$mode" > "$dir/$mode/gpu_bench.log" 2>&1
    done
    python3 "$sdpa_shapes" "$dir/sdpa.json" > "$dir/sdpa.log" 2>&1
  done
  python3 "$compare_peers" --rounds "$OUT/rounds" 2>&1 | tee "$OUT/compare_peers_rounds.txt"
fi
echo "== summary"
for part in "${parts[@]}"; do
  read -r name code <<< "$part"
  if [[ $code == 0 ]]; then echo "PASS $name"; else echo "FAIL $name (exit status $code)"; fi
done
exit "$status"
