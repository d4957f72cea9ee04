#!/usr/bin/env bash
# One GPU call (the device tool allows 10 minutes a command): throughput of one process with its
# per-case breakdown, then a campaign over every implementation and dtype in PARTS concurrent
# isolated processes (each takes every PARTS-th (implementation, dtype) campaign of the plan) next
# to the mutant zoo compiled in ZOO processes, then the compiled Triton test files. Results are
# archived into $OUT/results.tgz (the device tool returns at most 8 files).
#     bash benchmarks/gpu_call.sh [CAMPAIGN_SECONDS=280] [PARTS=12] [ZOO=4] [GRADIENT_EVERY=4] [SHARD_BASE=0]
# Parts are spread over every visible GPU (part p on GPU p mod NGPU). SHARD_BASE numbers the parts'
# shards (Hypothesis seeds 1000 * shard + ...): give each call its own base so calls draw other
# cases. Sum the campaign results of several calls with benchmarks/gpu_report.py.
set -uo pipefail
CAMPAIGN_SECONDS=${1:-280}
PARTS=${2:-12}
ZOO=${3:-4}
GRADIENT_EVERY=${4:-4}
SHARD_BASE=${5:-0}
source "$(dirname "$0")/gpu_common.sh"

if [[ "${SKIP_THROUGHPUT:-0}" != 1 ]]; then
    step "throughput, one process, gpu sizes"
    timeout 80 python3 benchmarks/throughput.py --profile gpu --cases 100 --impl sdpa \
        --dtype float32 --gradient-every "$GRADIENT_EVERY" 2>&1 | tee "$OUT/throughput.txt"
fi

step "campaign: $PARTS isolated parts x $CAMPAIGN_SECONDS s, gradients every $GRADIENT_EVERY cases; zoo in $ZOO processes"
campaign_parts "$PARTS" "$CAMPAIGN_SECONDS" "$SHARD_BASE" "$GRADIENT_EVERY"
mapfile -t MUTANTS < <(python3 -m fuzzattn.cli mutants --list 2>/dev/null | awk '/^mutant_/ {print $1}')
for z in $(seq 0 $(( ZOO - 1 ))); do
    (
        for i in "${!MUTANTS[@]}"; do
            (( i % ZOO == z )) || continue
            OMP_NUM_THREADS=1 timeout 45 python3 -m fuzzattn.cli mutants --only "${MUTANTS[$i]}" \
                --profile gpu --max-examples 60 --seconds 12 --isolate --timeout 30 2>&1 \
                | grep -E "^mutant_" | cut -c1-220
        done
    ) >"$OUT/zoo_$z.txt" 2>&1 &
done
# Beside the campaign: every regression file replayed compiled (isolated: some expect device
# faults), then the compiled Triton test files.
(
    timeout 200 python3 -m fuzzattn.cli replay regressions/ --isolate --timeout 60 >"$OUT/replay.txt" 2>&1
    timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 -rf --tb=line tests/test_triton_backward.py \
        tests/test_triton_configs.py >"$OUT/triton_tests.txt" 2>&1
) &
wait
cat "$OUT"/zoo_*.txt 2>/dev/null | sort | tee "$OUT/zoo_compiled.txt"
campaign_summary
grep -vE "  ok$|^-|^file" "$OUT/replay.txt" | cut -c1-200 | tail -25
grep -E "^/|passed|failed" "$OUT/triton_tests.txt" | grep -v Warning | tail -12
archive_out
