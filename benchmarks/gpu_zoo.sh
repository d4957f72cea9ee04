#!/usr/bin/env bash
# Named zoo mutants compiled on the GPU, one isolated `fuzzattn mutants` process each, in parallel:
# after a tolerance change, the mutants whose compiled margins were thinnest, to show each is
# still killed and at what margin.
#     DTYPE=float32 bash benchmarks/gpu_zoo.sh mutant_a mutant_b ...
set -uo pipefail
DTYPE=${DTYPE:-float32}
source "$(dirname "$0")/gpu_common.sh"
step "zoo, compiled, $DTYPE: $*"
for name in "$@"; do
    OMP_NUM_THREADS=1 timeout 150 python3 -m fuzzattn.cli mutants --only "$name" --dtype "$DTYPE" \
        --profile gpu --max-examples 60 --seconds 60 --isolate --timeout 30 >"$OUT/zoo_$name.txt" 2>&1 &
done
wait
cat "$OUT"/zoo_*.txt | grep -E "^mutant_" | sort | cut -c1-230
