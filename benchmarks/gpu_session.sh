#!/usr/bin/env bash
# One GPU session in one call (device time is scarce): install fuzzattn into the image's Python,
# then, compiled on the GPU: the Triton forward's configurations and the backward against their
# references, SDPA's backends as probed there, a real device fault under isolation, the mutant
# zoo, throughput at 1..16 pytest-xdist workers, and the forward/backward speed benchmarks.
# Everything printed also lands in $OUT (default gpu-out/).
#     bash benchmarks/gpu_session.sh [seconds budget for the whole script, default 560]
set -uo pipefail
OUT=${OUT:-gpu-out}
BUDGET=${1:-560}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() { echo; echo "== $1 ($(date +%T), $(left) s left)"; }

if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1; then
    echo "editable install failed: the registry (entry points) will be empty"; tail -5 "$OUT/install.log"
fi
python3 -c "import torch, triton, numpy, hypothesis; print('torch', torch.__version__, '| triton', triton.__version__, '| numpy', numpy.__version__, '| hypothesis', hypothesis.__version__, '|', torch.cuda.get_device_name(), '|', torch.get_num_threads(), 'threads')"

step "compiled: forward configurations, backward, SDPA backends, isolation (real device fault)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 --fuzzattn-profile gpu \
    tests/test_triton_configs.py tests/test_triton_backward.py tests/test_sdpa_backends.py \
    tests/test_isolation.py tests/test_real_kernels.py >"$OUT/compiled_tests.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/compiled_tests.txt" | tail -25

step "mutant zoo, compiled (60 cases, 8 s cap per mutant)"
timeout 170 python3 -m fuzzattn.cli mutants --profile gpu --max-examples 60 --seconds 8 \
    >"$OUT/mutants.txt" 2>&1
grep -E "SURVIVED|mutation score|error" "$OUT/mutants.txt" | tail -10

step "throughput: sdpa float32 at gpu sizes, 1..16 xdist workers, shards = workers"
for n in 1 4 8 16; do
    [ "$(left)" -lt 90 ] && break
    budget=$(( n * 150 ))
    OMP_NUM_THREADS=$(( 16 / n )) timeout 60 python3 -m pytest -q -p no:cacheprovider \
        tests/test_differential.py -k "sdpa-float32" -n "$n" --fuzzattn-shards "$n" \
        --fuzzattn-profile gpu --fuzzattn-max-examples "$budget" 2>&1 | grep -E "cases judged|failed" \
        | sed "s/^/workers=$n: /" | tee -a "$OUT/throughput.txt"
done

step "forward speed (TFLOP/s): triton_fa2 vs SDPA flash and cuDNN"
timeout $(( $(left) > 100 ? 80 : 30 )) python3 benchmarks/bench_forward.py 2>&1 | tee "$OUT/bench_forward.txt" | tail -40
step "backward speed (TFLOP/s): triton_fa2_backward vs SDPA flash"
timeout $(( $(left) > 40 ? $(left) - 20 : 20 )) python3 benchmarks/bench_backward.py 2>&1 | tee "$OUT/bench_backward.txt" | tail -30
echo; echo "session done in $(( $(date +%s) - START )) s"
# The device tool brings back at most 8 files: everything in one archive.
tar czf /tmp/fuzzattn-gpu.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/fuzzattn-gpu.tgz "$OUT/results.tgz"
