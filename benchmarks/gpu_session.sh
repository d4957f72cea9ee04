#!/usr/bin/env bash
# One GPU session, everything in one call (device time is scarce): install fuzzattn into the
# image's Python, run the suite's fast files and the differential tests with compiled kernels,
# the gate with the mutant self-test, and the benchmark. Results go to $OUT (default gpu-out/).
#     bash benchmarks/gpu_session.sh
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FUZZATTN_PROFILE=gpu

if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1; then
    echo "editable install failed (see install.log): running from the source tree"
    export PYTHONPATH=$PWD
    PLUGIN=(-p fuzzattn.pytest_plugin)
fi
fuzzattn() { python3 -m fuzzattn.cli "$@"; }
python3 -c "import torch, triton, numpy, hypothesis; print('torch', torch.__version__, '| triton', triton.__version__, '| numpy', numpy.__version__, '| hypothesis', hypothesis.__version__, '|', torch.cuda.get_device_name())"

step() { echo; echo "== $1 ($(date +%T))"; }
step "engine, checks, refusal, mutants, fixture replay (compiled)"
timeout 170 python3 -m pytest -q -p no:cacheprovider ${PLUGIN[@]+"${PLUGIN[@]}"} -x \
    tests/test_engine.py tests/test_checks.py tests/test_refusal.py tests/test_mutants.py regressions/ \
    2>&1 | tail -15 | tee "$OUT/suite.txt"
# Compiled Triton JIT-specialises on every new size/stride pattern: 150 cases per test took
# ~60 s per triton_fa2 dtype on the H200, so this stage gets 40.
step "differential, gpu sizes, 40 cases per implementation and dtype"
timeout 190 python3 -m pytest -q -p no:cacheprovider ${PLUGIN[@]+"${PLUGIN[@]}"} \
    tests/test_differential.py --fuzzattn-max-examples 40 --hypothesis-show-statistics \
    >"$OUT/differential.txt" 2>&1
grep -E "passed|failed|Error|FAIL|typical runtimes|Typical" "$OUT/differential.txt" | tail -30
step "gate with the mutant self-test"
timeout 120 fuzzattn gate --profile gpu --max-examples 40 --seconds 5 --mutants \
    --markdown "$OUT/gate.md" --junit-xml "$OUT/gate.xml" 2>&1 | tail -60
echo "gate exit status: ${PIPESTATUS[0]}"
step "benchmark"
timeout 60 python3 benchmarks/bench_cases.py --profile gpu --cases 25 2>&1 | tail -15
