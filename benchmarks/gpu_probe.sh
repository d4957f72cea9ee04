#!/usr/bin/env bash
# A GPU call that measures before anything is changed: how fuzzing scales over concurrent
# processes on one GPU (sdpa fp32, the gpu profile, gradients 1 in 4), with the GPU's utilisation
# sampled; one process's per-case breakdown; how Triton converts fp32 dot operands to TF32 and
# which model reproduces the open TF32 findings; the other open findings triaged; every
# regression file replayed compiled (the strict expected failures included).
#     bash benchmarks/gpu_probe.sh [SECONDS_PER_SCALING_RUN=30] [PROCESS_COUNTS="1 4 8 16"]
set -uo pipefail
SCALING_SECONDS=${1:-30}
COUNTS=${2:-1 4 8 16}
source "$(dirname "$0")/gpu_common.sh"

step "TF32 operand conversion and the open TF32 findings"
timeout 120 python3 benchmarks/tf32_probe.py 2>&1 | tee "$OUT/tf32_probe.txt"

step "throughput, one process, per-case breakdown"
timeout 90 python3 benchmarks/throughput.py --profile gpu --cases 150 --impl sdpa \
    --dtype float32 --gradient-every 4 2>&1 | tee "$OUT/throughput.txt"

# K processes fuzzing sdpa fp32 at once, in-process (no isolation worker), one thread each.
step "scaling over processes, sdpa fp32, $SCALING_SECONDS s each"
for k in $COUNTS; do scale_run "$k" "inproc_$k" 500 | tee -a "$OUT/scaling.txt"; done
scale_run 16 "isolated_16" 500 --isolate --timeout 60 | tee -a "$OUT/scaling.txt"

step "open findings triaged; regressions replayed compiled (parallel)"
F=benchmarks/gpu_findings
shopt -s nullglob
FINDINGS=("$F"/*.json)
if (( ${#FINDINGS[@]} )); then
    for impl in sdpa sdpa_efficient sdpa_cudnn sdpa_math sdpa_flash triton_fa2; do
        OMP_NUM_THREADS=2 timeout 200 python3 benchmarks/gpu_triage.py "${FINDINGS[@]}" --impl "$impl" \
            >"$OUT/triage_$impl.txt" 2>&1 &
    done
    OMP_NUM_THREADS=1 timeout 200 python3 benchmarks/sdpa_dispatch.py "${FINDINGS[@]}" \
        >"$OUT/dispatch.txt" 2>&1 &
fi
for impl in sdpa sdpa_efficient sdpa_cudnn sdpa_math sdpa_flash triton_fa2 torch_tiled; do
    OMP_NUM_THREADS=2 timeout 240 python3 -m fuzzattn.cli replay regressions/ --impl "$impl" \
        --isolate --timeout 60 >"$OUT/replay_$impl.txt" 2>&1 &
done
wait
cat "$OUT"/triage_*.txt "$OUT"/dispatch.txt 2>/dev/null | cut -c1-220
for f in "$OUT"/replay_*.txt; do
    echo "-- $f"; grep -vE "  ok$|^-|^file" "$f" | cut -c1-200 | tail -14
done
echo; cat "$OUT/scaling.txt"
archive_out
