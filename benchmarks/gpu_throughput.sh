#!/usr/bin/env bash
# A GPU call measuring throughput on one GPU as the issue counts it (the whole host driving it):
# one process's per-case breakdown, then K concurrent sdpa fp32 fuzzers for K in COUNTS with the
# default host judging (fuzzattn/judge/placement.py), and K=16 with every case judged on the device
# (FUZZATTN_HOST_JUDGE_MACS=0), the before of that change. Then, beside each other: the open
# findings triaged per SDPA backend, every regression file replayed on sdpa (isolated), and the
# zoo mutant whose compiled fp32 margin was thinnest, against the TF32 weight term.
# Environment: QUICK=1 skips the breakdown, the device-judged run and the checks (a scaling-only
# call).
#     bash benchmarks/gpu_throughput.sh [SCALING_SECONDS=30] [COUNTS="1 8 16"]
set -uo pipefail
SCALING_SECONDS=${1:-30}
COUNTS=${2:-1 8 16}
QUICK=${QUICK:-0}
source "$(dirname "$0")/gpu_common.sh"

if [[ "$QUICK" != 1 ]]; then
    step "throughput, one process, per-case breakdown (host judging)"
    timeout 90 python3 benchmarks/throughput.py --profile gpu --cases 150 --impl sdpa \
        --dtype float32 --gradient-every 4 2>&1 | tee "$OUT/throughput.txt"
fi

step "scaling over processes on one GPU, sdpa fp32, $SCALING_SECONDS s each"
for k in $COUNTS; do scale_run "$k" "host_judged_$k" 600 | tee -a "$OUT/scaling.txt"; done
if [[ "$QUICK" == 1 ]]; then
    archive_out
    exit 0
fi
FUZZATTN_HOST_JUDGE_MACS=0 scale_run 16 "device_judged_16" 600 | tee -a "$OUT/scaling.txt"

step "findings triaged, sdpa regressions replayed, the thinnest fp32 mutant (parallel)"
shopt -s nullglob
FINDINGS=(benchmarks/gpu_findings/*.json)
for impl in sdpa sdpa_math sdpa_efficient sdpa_cudnn sdpa_flash; do
    (( ${#FINDINGS[@]} )) || break
    OMP_NUM_THREADS=2 timeout 200 python3 benchmarks/gpu_triage.py "${FINDINGS[@]}" --impl "$impl" \
        >"$OUT/triage_$impl.txt" 2>&1 &
done
OMP_NUM_THREADS=2 timeout 200 python3 -m fuzzattn.cli replay regressions/ --impl sdpa --isolate \
    --timeout 60 >"$OUT/replay_sdpa.txt" 2>&1 &
OMP_NUM_THREADS=2 timeout 200 python3 -m fuzzattn.cli mutants --only mutant_no_running_max \
    --dtype float32 --profile gpu --max-examples 200 --seconds 90 --isolate --timeout 30 \
    >"$OUT/zoo_no_running_max.txt" 2>&1 &
wait
cat "$OUT"/triage_*.txt 2>/dev/null | sort | cut -c1-200
tail -n 1 "$OUT/replay_sdpa.txt"; grep -E " FAIL | XPASS" "$OUT/replay_sdpa.txt" | cut -c1-160
grep -vE "^\s*$" "$OUT/zoo_no_running_max.txt" | tail -8 | cut -c1-220
echo; cat "$OUT/scaling.txt"
archive_out
