#!/usr/bin/env bash
# Second GPU call of a session: triage the first call's findings (benchmarks/gpu_findings/) per
# backend and phase, `explain` the ones a factor can settle, the zoo mutants that need their own
# dtype's campaign, the compiled Triton test files, then the forward speed table on a quiet GPU.
#     bash benchmarks/gpu_triage.sh
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"

step "triage, explain, zoo (parallel)"
F=benchmarks/gpu_findings
for impl in sdpa sdpa_flash sdpa_efficient sdpa_cudnn sdpa_math triton_fa2; do
    OMP_NUM_THREADS=2 timeout 200 python3 benchmarks/gpu_triage.py $F/*.json --impl "$impl" \
        >"$OUT/triage_$impl.txt" 2>&1 &
done
for spec in "b72a48d1a5d8 sdpa_efficient" "a8a0386eea49 triton_fa2" "a2b1268679e2 triton_fa2" \
            "fcde2197009b sdpa" "e52a1b6ffc85 sdpa_cudnn"; do
    set -- $spec
    OMP_NUM_THREADS=1 timeout 200 python3 -m fuzzattn.cli explain "$F/$1.json" --impl "$2" \
        >"$OUT/explain_$1.txt" 2>&1 &
done
for spec in "mutant_acc_bf16 bfloat16" "mutant_acc_fp16 float16" "mutant_noop_p_cast float16" \
            "mutant_row_sum_low_precision float16" "mutant_pv_low_precision bfloat16" \
            "mutant_decode_ignores_causal float32" "mutant_empty_rows_nan float32"; do
    set -- $spec
    OMP_NUM_THREADS=1 timeout 200 python3 -m fuzzattn.cli mutants --only "$1" --dtype "$2" \
        --profile gpu --max-examples 100 --seconds 60 --isolate --timeout 30 2>&1 \
        | grep -E "^mutant_|survived|error" | cut -c1-220 >"$OUT/zoo_$1.txt" &
done
wait
cat "$OUT"/triage_*.txt | sort | cut -c1-200
for f in "$OUT"/explain_*.txt; do echo "-- $f"; tail -n 22 "$f" | cut -c1-180; done
cat "$OUT"/zoo_*.txt

step "compiled Triton tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 -rf --tb=line tests/test_triton_backward.py \
    tests/test_triton_configs.py 2>&1 | grep -E "^/|Error|error|assert|passed|failed" | cut -c1-220 \
    | tail -40 | tee "$OUT/triton_tests.txt"

step "forward speed, bf16, quiet GPU"
timeout 200 python3 benchmarks/bench_forward.py --head-dim 64 128 2>&1 | tee "$OUT/bench_forward.txt"
archive_out
