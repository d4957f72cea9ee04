#!/usr/bin/env bash
# Second GPU call: throughput (sdpa and the compiled triton_fa2 over 1..16 xdist workers), then
# the configuration and backward mutants compiled, one at a time so each result streams out.
# Leaves its files in $OUT for benchmarks/gpu_campaign.sh, which archives everything.
#     bash benchmarks/gpu_followup.sh
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { echo "editable install failed"; tail -5 "$OUT/install.log"; }
echo "== throughput, gpu sizes ($(date +%T))"
for spec in "sdpa-float32 16" "triton_fa2-float32 8"; do
    set -- $spec
    for n in 1 "$2"; do
        OMP_NUM_THREADS=$(( 16 / n )) timeout 32 python3 -m pytest -q -p no:cacheprovider \
            tests/test_differential.py -k "$1" -n "$n" --fuzzattn-shards "$n" \
            --fuzzattn-profile gpu --fuzzattn-max-examples $(( n * 200 )) 2>&1 \
            | grep -E "cases judged|passed|failed" | tr '\n' ' ' | sed "s/^/$1 workers=$n: /"
        echo
    done
done | tee "$OUT/throughput.txt"
echo "== configuration and backward mutants, compiled ($(date +%T))"
for m in mutant_diagonal_bounds_block_m_lt_n mutant_maskfree_ragged_tail mutant_skip_off_by_one_block \
         mutant_lse_base2 mutant_bwd_dkdv_ignores_causal mutant_bwd_delta_from_dout mutant_bwd_ds_unscaled \
         mutant_bwd_lse_base2 mutant_bwd_gqa_first_head_only mutant_bwd_dq_skips_key_block \
         mutant_bwd_dq_grid_floor; do
    timeout 22 python3 -m fuzzattn.cli mutants --only "$m" --profile gpu --max-examples 60 --seconds 5 2>&1 \
        | grep -E "^mutant_" | cut -c1-200
done | tee "$OUT/mutants_compiled.txt"
