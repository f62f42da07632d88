#!/usr/bin/env bash
# Runs the GPU tests (and, when present, gpu_bench and ../shared/peers/torch_peers.py) on a
# GPU machine, writing logs and JSON under $OUT (default: ./gpu-out beside this script).
#
# From a bundle folder made by scripts/gpu-bundle:   BUNDLE/run.sh
# From a build tree:                                 BUILD=build tests/gpu/run.sh
# Extra arguments go to gpu_test (e.g. --gtest_filter='*Decode*').
# RUN_BENCH=0 skips gpu_bench; RUN_PEERS=0 skips torch_peers.py. Exit status: gpu_test's.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -f "$here/env.sh" ]]; then
  # shellcheck source=/dev/null
  source "$here/env.sh"
  bin="$here/bin"
  peers="$here/shared/peers/torch_peers.py"
else
  root="$(cd "$here/../.." && pwd)"
  build="${BUILD:-build}"
  [[ "$build" = /* ]] || build="$root/$build"
  bin="$build/tests/gpu"
  peers="$root/../shared/peers/torch_peers.py"
fi
export OUT="${OUT:-$here/gpu-out}"
mkdir -p "$OUT"

command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader | tee "$OUT/nvidia-smi.txt"

echo "== gpu_test"
"$bin/gpu_test" --gtest_output="json:$OUT/gpu_test.json" "$@" 2>&1 | tee "$OUT/gpu_test.log"
status=${PIPESTATUS[0]}

# Summary from the JSON report: totals, then each failure with its first message line.
if command -v python3 > /dev/null && [[ -f "$OUT/gpu_test.json" ]]; then
  python3 - "$OUT/gpu_test.json" <<'PY'
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
  grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/gpu_test.log" || true
fi
echo "gpu_test exit status $status"

if [[ "${RUN_BENCH:-1}" != 0 && -x "$bin/gpu_bench" ]]; then
  echo "== gpu_bench"
  "$bin/gpu_bench" 2>&1 | tee "$OUT/gpu_bench.log"
fi
if [[ "${RUN_PEERS:-1}" != 0 && -f "$peers" ]] && python3 -c 'import torch' 2> /dev/null; then
  echo "== torch_peers.py"
  python3 "$peers" 2>&1 | tee "$OUT/torch_peers.log"
fi
exit "$status"
