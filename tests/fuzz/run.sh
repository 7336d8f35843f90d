#!/usr/bin/env bash
# The long fuzz run (design/reliability.md). From the repository root:
#   bash tests/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
# Needs a nightly toolchain and cargo-fuzz. Runs every target in turn (nice, one job each),
# seeded from tests/fuzz/seeds/<target> and the recorded crashes, growing the (gitignored)
# corpus in tests/fuzz/corpus/<target>; prints each target's executions and coverage.
set -euo pipefail
secs="${1:-600}"; shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(desired_loader allowed_signers armored_signature talosconfig kubeconfig sim_http)
fi
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
logs="${FUZZ_LOGS:-tests/fuzz/target/logs}"
mkdir -p "$logs"
for t in "${targets[@]}"; do
  mkdir -p "tests/fuzz/corpus/$t" "tests/fuzz/regressions/$t"
  nice -n 19 cargo +nightly fuzz run --fuzz-dir tests/fuzz -s none -a "$t" \
    "tests/fuzz/corpus/$t" "tests/fuzz/seeds/$t" "tests/fuzz/regressions/$t" \
    -- -max_total_time="$secs" -jobs=1 -print_final_stats=1 >"$logs/$t.log" 2>&1 || {
      echo "$t: crashed, see $logs/$t.log and tests/fuzz/artifacts/$t/"; continue; }
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$t.log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]*' "$logs/$t.log" | tail -1 || echo 'cov: ?')
  echo "$t: $runs executions, $cov"
done
