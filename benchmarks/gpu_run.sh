#!/usr/bin/env bash
# On a CUDA host, from the repository root: install this checkout over the host's torch and
# triton, then run what benchmarks/REPORT.md's GPU tables report. Each step writes under OUT.
#     bash benchmarks/gpu_run.sh [suite] [zoo] [campaign] [throughput] [speed] [watched] [flex] [defects]
#                                [sdpa] [workers] [gate] [variants] [references] [explain]
#                                            (default: all but variants, references and explain)
#   suite       `pytest -n auto` as the README runs it (tests/ and the regressions/ replays) on
#               compiled kernels and the CUDA backends, its SUITE_DURATIONS slowest tests
#   zoo         every mutant (or those matching the regex ZOO_ONLY) fuzzed compiled, ZOO processes
#               side by side, ZOO_SECONDS at most each (shared by its dtype campaigns)
#               (ZOO_CASES cases at most each, default 100)
#   campaign    PARTS isolated campaign parts spread over the GPUs, CAMPAIGN_SECONDS each
#   throughput  K = 1 and 16 sdpa fp32 fuzzers side by side on GPU 0, 30 s (MPS=1: under MPS)
#   speed       the forward and backward TFLOP/s tables
#   watched     the fuzz command watched (the default) against in-process, and a Triton kernel's
#               illegal address saved as device_fault and replayed
#   flex        FlexAttention fuzzed FLEX_SECONDS per dtype (compiles included) with its shape
#               palette, and float32 once without it (FUZZATTN_PALETTE=off): cases/s each
#   defects     compiled: configurations pruned by their real compile errors, no configuration
#               compiling as a finding; every distinct defect of a two-bug kernel in one run;
#               a two-bug Triton kernel and the autotuned example over --workers auto, twice on
#               one directory: one row and one file per cause
#   sdpa        sdpa per dtype over --workers auto for SDPA_SECONDS each, known defects judged
#               (the shares passed over and judged without gradients, hits)
#   workers     `fuzzattn fuzz --workers auto` on sdpa fp32 for 60 s (every check, gradients on
#               every case as the command judges them), then cases/s for --workers 1..32 and the
#               ratio to 1 worker for WORKERS (default 2,4,8,16,32,auto; WORKER_SECONDS each):
#               what PER_GPU in fuzzattn/cli/workers.py should be
#   gate        `fuzzattn gate` as a user runs it before a merge (its default budget on a GPU host)
#   compiled    compile economy: the autotuned example and triton_fa2 fuzzed with default flags
#               for COMPILED_SECONDS each (cases/s); sdpa bf16 against fp32 in one process
#               (stage times, and the functions a bf16 case spends its time in), and per SDPA
#               backend a new shape's first call against repeats (benchmarks/sdpa_shapes.py)
#   variants    the Triton kernels on the attention variants: VARIANT_IMPLS (default triton_fa2 and
#               triton_fa2_varlen) over VARIANT_PALETTES, VARIANT_PROCESSES processes side by side
#               for VARIANT_SECONDS (shards from VARIANT_SHARD; gradients on one case in four);
#               cases drawn per variant
#   references  the variant references on CUDA (REFERENCE_IMPLS, default sdpa_alibi, sdpa_varlen,
#               flex_varlen), each dtype over --workers REFERENCE_WORKERS (default auto) for
#               REFERENCE_SECONDS per command
#   explain     `fuzzattn explain FILE --impl NAME` for each FILE:NAME in EXPLAIN (default: the
#               flex strided-last-dim file), to narrow a CUDA-only defect's predicate
set -uo pipefail
OUT=${OUT:-gpu-out} CAMPAIGN_SECONDS=${CAMPAIGN_SECONDS:-300} PARTS=${PARTS:-12} ZOO=${ZOO:-16} ZOO_SECONDS=${ZOO_SECONDS:-60}
FLEX_SECONDS=${FLEX_SECONDS:-60} SDPA_SECONDS=${SDPA_SECONDS:-120} WORKERS=${WORKERS:-2,4,8,16,32,auto} WORKER_SECONDS=${WORKER_SECONDS:-30}
EXPLAIN=${EXPLAIN:-regressions/208e505db4d8.json:flex}
COMPILED_SECONDS=${COMPILED_SECONDS:-120} VARIANT_SECONDS=${VARIANT_SECONDS:-420}
VARIANT_PROCESSES=${VARIANT_PROCESSES:-16} REFERENCE_SECONDS=${REFERENCE_SECONDS:-120}
STEPS=${*:-suite zoo campaign throughput speed watched flex defects sdpa workers compiled gate}
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU") || { echo "gpu_run.sh: no GPU visible"; exit 2; }
mkdir -p "$OUT"
step() { echo; echo "== $1 ($(date +%T))"; }
# Bytecode cached for every later process (without it each fuzzer compiles torch's lazy imports).
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/fuzzattn-pycache}
unset PYTHONDONTWRITEBYTECODE
# INSTALL=0: the checkout is installed already (two runs of this script side by side).
[ "${INSTALL:-1}" = 0 ] || python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { echo "install failed: $OUT/install.log"; exit 1; }

for s in $STEPS; do case $s in
suite)
    step "test suite: pytest -n auto, as a user runs it"
    started=$(date +%s)
    # SUITE_LIMIT: seconds before pytest is interrupted (it still prints its slowest tests)
    timeout -s INT "${SUITE_LIMIT:-1200}" python3 -m pytest -q -p no:cacheprovider -n auto -rfs \
        --tb=short --durations="${SUITE_DURATIONS:-40}" >"$OUT/suite.txt" 2>&1
    echo "pytest exit $? in $(( $(date +%s) - started )) s"
    grep -E "passed|failed" "$OUT/suite.txt" | tail -n 1 ;;
zoo)
    step "mutant zoo, compiled"
    rm -rf "$OUT/zoo"; mkdir -p "$OUT/zoo"
    mapfile -t MUTANTS < <(python3 -m fuzzattn.cli mutants --list | awk '/^mutant_/ {print $1}' \
        | grep -E "${ZOO_ONLY:-.}")
    for z in $(seq 0 $(( ZOO - 1 ))); do
        for i in "${!MUTANTS[@]}"; do
            # A case compiling when the cap comes runs on: `timeout` bounds each mutant, so a lane
            # ends and the table is written whatever a compile takes.
            (( i % ZOO == z )) && { OMP_NUM_THREADS=1 timeout -k 10 $(( ZOO_SECONDS * 3 / 2 + 30 )) \
                python3 -m fuzzattn.cli mutants --only "${MUTANTS[$i]}" --profile gpu \
                --max-examples "${ZOO_CASES:-100}" --seconds "$ZOO_SECONDS"; echo "${MUTANTS[$i]} exit $?"; }
        done >"$OUT/zoo/lane_$z.txt" 2>&1 &
    done; wait
    # A mutant whose command printed no kill-table row: its lane's log says why.
    for m in "${MUTANTS[@]}"; do awk -v m="$m" '$1 == m && $2 !~ /^[0-9]+$/ && $2 != "exit" {f = 1} END {exit !f}' "$OUT"/zoo/lane_*.txt || {
        echo "$m: no kill-table row"; grep -h -B 15 "^$m exit" "$OUT"/zoo/lane_*.txt | tail -n 15; }; done
    # Kill-table rows only (a defects-table row has a number in its second column).
    grep -h "^mutant_" "$OUT"/zoo/lane_*.txt | awk '$2 !~ /^[0-9]+$/ && $2 != "exit"' | sort | tee "$OUT/zoo.txt" \
        | awk '{n++} $2 == "killed" {k++; print $4}' | sort -n | awk '{c[NR] = $1} END {
            print NR " killed, cases to kill: median " c[int((NR + 1) / 2)] ", max " c[NR]}'
    echo "of $(wc -l <"$OUT/zoo.txt") mutants" ;;
campaign)
    step "campaign: $PARTS parts x $CAMPAIGN_SECONDS s over $NGPU GPU(s)"
    rm -rf "$OUT/campaign"                 # --report sums every result under it
    for p in $(seq 0 $(( PARTS - 1 ))); do
        CUDA_VISIBLE_DEVICES=$(( p % NGPU )) OMP_NUM_THREADS=1 python3 benchmarks/gpu_campaign.py \
            --seconds "$CAMPAIGN_SECONDS" --part "$p/$PARTS" --shard "$p" --isolate --timeout 60 \
            --gradient-every 4 --out "$OUT/campaign" >"$OUT/campaign_$p.txt" 2>&1 &
    done; wait
    python3 benchmarks/gpu_campaign.py --report "$OUT/campaign" | tee "$OUT/campaign.md" ;;
throughput)
    if [[ "${MPS:-0}" == 1 ]]; then nvidia-cuda-mps-control -d; fi
    for k in 1 16; do
        step "throughput: $k sdpa fp32 fuzzers"
        rm -rf "$OUT/throughput_$k"
        for i in $(seq 0 $(( k - 1 ))); do
            CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=1 python3 benchmarks/gpu_campaign.py --impl sdpa \
                --dtype float32 --seconds 30 --gradient-every 4 --warm-up 5 --shard "$i" \
                --out "$OUT/throughput_$k" >"$OUT/throughput_${k}_$i.txt" 2>&1 &
        done; wait
        python3 benchmarks/gpu_campaign.py --report "$OUT/throughput_$k" | grep "cases judged in all"
    done
    if [[ "${MPS:-0}" == 1 ]]; then echo quit | nvidia-cuda-mps-control; fi ;;
speed)
    step "speed"
    python3 benchmarks/speed.py --pass both 2>&1 | tee "$OUT/speed.txt" ;;
watched)
    step "watched against in-process: sdpa fp32, profile gpu"
    python3 benchmarks/throughput.py --cli --impl sdpa --dtype float32 --cases 1000 --repeats 3 \
        --profile gpu 2>&1 | tee "$OUT/watched.txt"
    step "a device fault, found and replayed"
    rm -rf "$OUT/fault"
    python3 -m fuzzattn.cli fuzz --impl tests/isolation_kernels.py:TRITON_OOB --max-examples 30 \
        --regressions-dir "$OUT/fault" >"$OUT/fault.txt" 2>&1; echo "fuzz exit $?" | tee -a "$OUT/fault.txt"
    grep -E "device_fault|regression file|replay:" "$OUT/fault.txt"
    replay=$(grep -oE "fuzzattn replay .*" "$OUT/fault.txt" | head -n 1)
    [[ -n "$replay" ]] && { python3 -m fuzzattn.cli ${replay#fuzzattn } >"$OUT/fault_replay.txt" 2>&1
        echo "replay exit $?"; grep -E "device_fault|FAIL" "$OUT/fault_replay.txt" | head -n 3; } ;;
flex)
    # The summary row reads: flex  DTYPE  VERDICT  CASES  SECONDS  ...
    for run in float32 bfloat16 float16 float32:off; do
        d=${run%%:*} palette=$([[ $run == *:off ]] && echo off || echo auto)
        step "flex $d, FUZZATTN_PALETTE=$palette, $FLEX_SECONDS s"
        FUZZATTN_PALETTE=$palette python3 -m fuzzattn.cli fuzz --impl flex --dtype "$d" --profile gpu \
            --seconds "$FLEX_SECONDS" --max-examples 1000000 --no-save >"$OUT/flex_${d}_$palette.txt" 2>&1
        echo "fuzz exit $?"
        awk -v d="$d" -v p="$palette" '$1 == "flex" && $2 == d && $5 > 0 {
            printf "flex %s palette=%s: %d cases in %.1f s = %.2f cases/s (%s)\n", d, p, $4, $5, $4 / $5, $3}' \
            "$OUT/flex_${d}_$palette.txt"
    done ;;
defects)
    for k in STATIC_ASSERT NONE_COMPILES RAISING TWO_BUGS; do
        step "defects: tests/pruning_kernels.py:$k"
        rm -rf "$OUT/defects_$k"
        python3 -m fuzzattn.cli fuzz --impl "tests/pruning_kernels.py:$k" --max-examples 200 \
            --seconds 120 --regressions-dir "$OUT/defects_$k" >"$OUT/defects_$k.txt" 2>&1
        echo "fuzz exit $?"
        sed -n '/^defects by cause/,/^$/p; /^pruned (/,/^$/p' "$OUT/defects_$k.txt"
    done
    # Causes over every worker: one row and one file per cause, and a second run (another seed)
    # on the same directory adds no file.
    for spec in tests/pruning_kernels.py:TRITON_TWO_BUGS examples/autotuned_causal_attention.py:AUTOTUNED_CAUSAL; do
        dir="$OUT/causes_${spec##*:}"; rm -rf "$dir"
        for seed in 0 1; do
            step "causes: $spec --workers auto, seed $seed"
            python3 -m fuzzattn.cli fuzz --impl "$spec" --dtype float16 --workers auto --seconds 60 \
                --hypothesis-seed $seed --database off --regressions-dir "$dir" >"$dir.$seed.txt" 2>&1
            echo "fuzz exit $?; files: $(ls "$dir" | wc -l)"
            sed -n '/^defects by cause/,/^$/p' "$dir.$seed.txt"
        done
    done ;;
sdpa)
    for d in float32 bfloat16 float16; do
        step "defects: sdpa $d, $SDPA_SECONDS s over --workers auto, known defects judged"
        python3 -m fuzzattn.cli fuzz --impl sdpa --dtype "$d" --profile gpu --seconds "$SDPA_SECONDS" \
            --workers auto --database off --max-examples 1000000 --no-save >"$OUT/defects_sdpa_$d.txt" 2>&1
        echo "fuzz exit $?"
        sed -n '/^sdpa  /p; /^defects by cause/,/^$/p; /^counted without/,/^$/p' "$OUT/defects_sdpa_$d.txt"
    done ;;
workers)
    step "fuzz --workers auto: sdpa fp32, 60 s, profile gpu"
    python3 -m fuzzattn.cli fuzz --impl sdpa --dtype float32 --workers auto --seconds 60 \
        --max-examples 1000000 --no-save --database off --profile gpu >"$OUT/workers_auto.txt" 2>&1
    echo "fuzz exit $?"
    grep -E "^fuzzattn fuzz:|^sdpa " "$OUT/workers_auto.txt" \
        | awk '{print} $1 == "sdpa" && $5 > 0 {printf "%.1f cases/s\n", $4 / $5}'
    step "worker scaling: sdpa fp32, $WORKER_SECONDS s per command"
    python3 benchmarks/throughput.py --cli-workers "$WORKERS" --seconds "$WORKER_SECONDS" --profile gpu \
        --impl sdpa --dtype float32 2>&1 | tee "$OUT/workers_scaling.txt" ;;
compiled)
    for spec in examples/autotuned_causal_attention.py:AUTOTUNED_CAUSAL triton_fa2; do
        step "compiled: fuzz --impl $spec, default flags, $COMPILED_SECONDS s"
        python3 -m fuzzattn.cli fuzz --impl "$spec" --seconds "$COMPILED_SECONDS" --database off \
            --no-save >"$OUT/compiled_${spec##*:}.txt" 2>&1
        echo "fuzz exit $?"
        grep -E "^fuzzattn fuzz:|cases/s" "$OUT/compiled_${spec##*:}.txt"
        # The dtype campaigns run one after another, sharing --seconds: the rate is over their sum.
        awk '$2 ~ /^(float|bfloat)/ && $5 > 0 {n += $4; s += $5; print}
             END {if (s) printf "%d cases, %.1f cases/s\n", n, n / s}' "$OUT/compiled_${spec##*:}.txt"
    done
    for d in float32 bfloat16; do
        step "sdpa $d, one process, 30 s: stage times and profile"
        python3 benchmarks/gpu_campaign.py --impl sdpa --dtype "$d" --seconds 30 --gradient-every 4 \
            --warm-up 5 --stage-times "$OUT/stages_$d.json" --out "$OUT/stages_$d" >/dev/null 2>&1
        python3 -c "import json,sys; print(json.load(open(sys.argv[1])))" "$OUT/stages_$d.json"
        FUZZATTN_SUPERVISE=off python3 -m cProfile -o "$OUT/sdpa_$d.prof" -m fuzzattn.cli fuzz --impl sdpa \
            --dtype "$d" --workers 1 --seconds 30 --max-examples 1000000 --no-save --database off \
            --profile gpu >"$OUT/sdpa_$d.txt" 2>&1
        grep -E "^sdpa " "$OUT/sdpa_$d.txt"
        python3 -c "import pstats,sys; pstats.Stats(sys.argv[1]).sort_stats('tottime').print_stats(25)" \
            "$OUT/sdpa_$d.prof" | tail -n 40
    done
    step "sdpa per backend: a new shape's first call against repeats"
    python3 benchmarks/sdpa_shapes.py --shapes 30 --repeats 3 ;;
variants)
    impls=(${VARIANT_IMPLS:-triton_fa2 triton_fa2_varlen}) palettes=(${VARIANT_PALETTES:-2 5 0 1})
    step "variants: ${impls[*]} over palettes ${palettes[*]}, $VARIANT_PROCESSES processes"
    rm -rf "$OUT/variants"
    # For triton_fa2 palette n draws window, softcap, window+softcap as n mod 3 is 0, 1, 2
    # (palette.in_turn); a palette several processes share is compiled once, in Triton's cache.
    for p in $(seq 0 $(( VARIANT_PROCESSES - 1 ))); do
        impl=${impls[$(( p % ${#impls[@]} ))]} palette=${palettes[$(( p / ${#impls[@]} % ${#palettes[@]} ))]}
        OMP_NUM_THREADS=1 timeout -k 10 $(( VARIANT_SECONDS + 120 )) python3 benchmarks/gpu_campaign.py \
            --impl "$impl" --seconds "$VARIANT_SECONDS" --shard "$(( p + ${VARIANT_SHARD:-0} ))" \
            --palette "$palette" --gradient-every 4 --out "$OUT/variants" >"$OUT/variants_$p.txt" 2>&1 &
    done; wait
    grep -h "failures [1-9]\|Error" "$OUT"/variants_*.txt | head -n 20
    python3 benchmarks/gpu_campaign.py --report "$OUT/variants" | tee "$OUT/variants.md" ;;
references)
    for spec in ${REFERENCE_IMPLS:-sdpa_alibi sdpa_varlen flex_varlen}; do
        step "reference on CUDA: $spec, $REFERENCE_SECONDS s over --workers ${REFERENCE_WORKERS:-auto}"
        python3 -m fuzzattn.cli fuzz --impl "fuzzattn.kernels.$spec:IMPL" --profile gpu \
            --seconds "$REFERENCE_SECONDS" --workers "${REFERENCE_WORKERS:-auto}" --database off --max-examples 1000000 \
            --regressions-dir "$OUT/references_$spec" >"$OUT/references_$spec.txt" 2>&1
        echo "fuzz exit $?"
        sed -n '/^impl  /,/^$/p; /^defects by cause/,/^$/p; /^counted without/,/^$/p' "$OUT/references_$spec.txt"
    done ;;
gate)
    step "fuzzattn gate, as typed"
    rm -rf "$OUT/gate"; cp -r regressions "$OUT/gate"      # what it saves stays out of the tree
    started=$(date +%s)
    python3 -m fuzzattn.cli gate --regressions-dir "$OUT/gate" >"$OUT/gate.txt" 2>&1
    echo "gate exit $? in $(( $(date +%s) - started )) s"
    tail -n 30 "$OUT/gate.txt" ;;
explain)
    for entry in $EXPLAIN; do
        # FILE:NAME, where NAME may itself be module:NAME
        file=${entry%%:*} impl=${entry#*:}
        step "explain $file on $impl"
        python3 -m fuzzattn.cli explain "$file" --impl "$impl" 2>&1 \
            | tee "$OUT/explain_$(basename "$file" .json)_${impl//[:\/]/_}.txt"
    done ;;
*)  echo "gpu_run.sh: unknown step $s (suite, zoo, campaign, throughput, speed, watched, flex, defects, sdpa, workers, gate, explain)"; exit 2 ;;
esac; done
