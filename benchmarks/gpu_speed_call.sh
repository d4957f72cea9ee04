#!/usr/bin/env bash
# GPU calls of the throughput work (issue #11), each a before/after in one call on one H200:
#   bash benchmarks/gpu_speed_call.sh sdpa      the judge's correctness checks on the GPU, then K
#                                               concurrent sdpa fp32 fuzzers, this tree (K = 1, 16)
#                                               and the BEFORE tree (K = 16)
#   bash benchmarks/gpu_speed_call.sh ab        K = 1 and 16 concurrent sdpa_math fp32 fuzzers (no known
#                                               upstream defect, so no shrinking or fault confounds the
#                                               rate), this tree and BEFORE alternately (AB_IMPL,
#                                               AB_COUNTS: another implementation, other K)
#   bash benchmarks/gpu_speed_call.sh mps       16 sdpa fp32 fuzzers under MPS, this tree and BEFORE
#   bash benchmarks/gpu_speed_call.sh mpsfault  a real device fault beside an innocent judging
#                                               process, without and under MPS (mps_fault_probe.py)
#                                               (MPS_ROUNDS pairs, the order alternating)
#   bash benchmarks/gpu_speed_call.sh mpspytest the same fault inside `pytest -n 4` (mps_pytest_probe.py),
#                                               without and under MPS: the plugin's stop of the session
#   bash benchmarks/gpu_speed_call.sh triton    compiled triton_fa2 fp16, 16 processes: this tree
#                                               warms its compile palettes (WARM s), then is timed
#                                               on new cases of the same palettes; the BEFORE tree
#                                               timed the same way (it has no palettes)
#   bash benchmarks/gpu_speed_call.sh ceiling   the host's cores; 16 sdpa fp32 fuzzers with the GPU
#                                               hidden (the CPU's own ceiling), then K = 1, 8, 16 on it
#   bash benchmarks/gpu_speed_call.sh triage    the open findings explained (this tree), replayed (BEFORE),
#                                               and their rows' raw lse and out (probe_rows.py; for an
#                                               sdpa finding: per backend, and the dispatch's pick)
#   bash benchmarks/gpu_speed_call.sh fma       finding 10's regression files replayed compiled: this
#                                               tree, BEFORE, and BEFORE with FMA contraction off
#   bash benchmarks/gpu_speed_call.sh census    kernels, copies and waits per judged case (launch_census.py)
#   bash benchmarks/gpu_speed_call.sh contention what K processes sharing the GPU cost each other:
#                                               synchronisations/s and launches/s (K = 1, 4, 16),
#                                               the device part of judging alone (K = 1, 16), 16 sdpa
#                                               fp32 fuzzers; the same again under MPS when the host
#                                               has it (contention_probe.py)
#   bash benchmarks/gpu_speed_call.sh hostprofile where a case's host time goes (host_profile.py): sdpa
#                                               fp32, one process under cProfile alone, then one of 16
#   bash benchmarks/gpu_speed_call.sh macs      16 sdpa fp32 fuzzers with more cases judged on the host
#                                               (FUZZATTN_HOST_JUDGE_MACS = MACS_VALUES, default
#                                               2^21 (the default), 2^23, 2^25)
#   bash benchmarks/gpu_speed_call.sh stages    wall-clock time per judge stage (stage_times.py), sdpa fp32,
#                                               K = 1 and 16, every process timed
#   bash benchmarks/gpu_speed_call.sh waits     sdpa fp32 fuzzers by FUZZATTN_CUDA_WAIT (fuzzattn/platform/cuda_waits.py):
#                                               WAIT_VALUES in order (default auto block yield block
#                                               auto yield) for each K in WAIT_COUNTS (default 16)
#   bash benchmarks/gpu_speed_call.sh checks    16 sdpa fp32 fuzzers with FUZZATTN_HOST_CHECK_ELEMENTS =
#                                               CHECK_VALUES (default 0 (checks on the device), 2^17
#                                               (the default), 2^19)
#   bash benchmarks/gpu_speed_call.sh rows      K fuzzers of each implementation and dtype in ROWS (default
#                                               "sdpa:bfloat16 sdpa:float16 torch_tiled:float32"), K in
#                                               ROW_COUNTS (default 1 16): THROUGHPUT.md's per-row rates
#   bash benchmarks/gpu_speed_call.sh suite     the test suite on the GPU (SUITE_TESTS, default all of
#                                               tests/): which fail there, by name
# Several modes run one after the other: bash benchmarks/gpu_speed_call.sh triton ab
# BEFORE is a tarball of the tree to compare with (git archive <rev> -o benchmarks/_before.tar).
set -uo pipefail
MODES=("${@:-sdpa}")
SCALING_SECONDS=${SCALING_SECONDS:-30}
WARM=${WARM:-90}
source "$(dirname "$0")/gpu_common.sh"
BEFORE=/tmp/before
if [[ -f benchmarks/_before.tar ]]; then
    mkdir -p "$BEFORE" && tar xf benchmarks/_before.tar -C "$BEFORE"
fi

# Run "$@" with an MPS control daemon started for it (its pipe and log under /tmp, so the
# processes started meanwhile connect to it) and stopped after; says so when the host has none.
under_mps() {
    if ! command -v nvidia-cuda-mps-control >/dev/null; then
        echo "no nvidia-cuda-mps-control on this host: MPS not measured"; return 0
    fi
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/fuzzattn-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/fuzzattn-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
        "$@"
        echo quit | nvidia-cuda-mps-control
        sleep 2
    else
        echo "MPS control daemon did not start"
    fi
    tail -n 5 "$CUDA_MPS_LOG_DIRECTORY"/*.log 2>/dev/null
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

# 16 sdpa fp32 fuzzers once per value of an environment variable, each run labelled with it.
sweep() {   # $1 = the variable, $2 = label prefix, $3 = first shard, $4... = its values
    # A value given twice is run twice, each run in a folder of its own (_2, _3 ...): sharing one,
    # the second run's summary counted the first's results too (call 47).
    local var=$1 label=$2 base=$3 value run
    local -A runs=()
    shift 3
    for value in "$@"; do
        run=$(( ${runs[$value]:-0} + 1 )); runs[$value]=$run
        local name="${label}_$value"; (( run > 1 )) && name+="_$run"
        ( export "$var=$value"; scale_run 16 "$name" "$base" ) | tee -a "$OUT/scaling.txt"
    done
}

SUITE_PID=
wait_suite() {   # the background suite's summary, once it ended
    [[ -n "$SUITE_PID" ]] || return 0
    wait "$SUITE_PID"; SUITE_PID=
    step "the judge's tests on the GPU: summary"
    grep -E "(FAILED|ERROR) |passed|failed" "$OUT/suite_gpu.txt" | cut -c1-220 | sort -u | head -80
}

for MODE in "${MODES[@]}"; do
[[ "$MODE" =~ ^(sdpa|ab|triton|ceiling|contention|mps|hostprofile|macs|stages|checks|rows|waits|mpsfault)$ ]] && wait_suite
if [[ "$MODE" == sdpa ]]; then
    step "the judge on the GPU: engine, checks, gradients, transfer, palette tests, this tree and BEFORE"
    TESTS="tests/test_engine.py tests/test_checks.py tests/test_gradients.py tests/test_judge_device.py
           tests/test_fixtures.py"
    # SIGINT at the limit: pytest still prints its summary of failures.
    timeout -s INT 200 python3 -m pytest -q -p no:cacheprovider -n 6 -rfs --tb=no $TESTS \
        tests/test_transfer.py tests/test_palette.py >"$OUT/pytest_gpu.txt" 2>&1 &
    if [[ -d "$BEFORE" ]]; then
        (cd "$BEFORE" && PYTHONPATH=. timeout -s INT 200 python3 -m pytest -q -p no:cacheprovider \
            -n 6 -rfs --tb=no $TESTS) >"$OUT/pytest_gpu_before.txt" 2>&1 &
    fi
    timeout 200 python3 -m fuzzattn.cli replay regressions/5c3e8c48af81.json --impl triton_fa2 \
        >"$OUT/replay_ptxas.txt" 2>&1 &
    wait
    for f in pytest_gpu pytest_gpu_before; do
        echo "-- $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/$f.txt" | cut -c1-200 | head -30
    done
    tail -n 3 "$OUT/replay_ptxas.txt" | cut -c1-200
    step "sdpa fp32 scaling, $SCALING_SECONDS s each"
    for k in 1 16; do scale_run "$k" "after_$k" 600 | tee -a "$OUT/scaling.txt"; done
    [[ -d "$BEFORE" ]] && SCALE_TREE=$BEFORE scale_run 16 "before_16" 700 | tee -a "$OUT/scaling.txt"
elif [[ "$MODE" == triton ]]; then
    export SCALE_IMPL=triton_fa2 SCALE_DTYPE=float16
    step "compiled triton_fa2 fp16: warm-up, 16 processes over 4 palettes, $WARM s"
    SCALING_SECONDS=$WARM SCALE_PALETTES=4 scale_run 16 "triton_warmup" 800 | tee -a "$OUT/scaling.txt"
    step "compiled triton_fa2 fp16: timed on new cases of the same palettes, $SCALING_SECONDS s"
    SCALE_PALETTES=4 scale_run 16 "triton_after_16" 900 | tee -a "$OUT/scaling.txt"
    [[ -z "${SKIP_SINGLE:-}" ]] && SCALE_PALETTES=4 scale_run 1 "triton_after_1" 950 | tee -a "$OUT/scaling.txt"
    [[ -d "$BEFORE" && -z "${SKIP_BEFORE:-}" ]] && SCALE_TREE=$BEFORE scale_run 16 "triton_before_16" 1000 \
        | tee -a "$OUT/scaling.txt"
elif [[ "$MODE" == triage ]]; then
    step "open findings of benchmarks/gpu_findings: explained on this tree, replayed on BEFORE"
    shopt -s nullglob           # none open: nothing to triage
    impl_of() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("impl") or "triton_fa2")' "$1"; }
    for f in benchmarks/gpu_findings/*.json; do
        impl=$(impl_of "$f")
        timeout 150 python3 -m fuzzattn.cli explain "$f" --impl "$impl" >"$OUT/explain_$(basename "$f" .json).txt" 2>&1 &
        if [[ -d "$BEFORE" ]]; then
            (cd "$BEFORE" && PYTHONPATH=. timeout 150 python3 -m fuzzattn.cli replay "$OLDPWD/$f" \
                --impl "$impl") >"$OUT/before_$(basename "$f" .json).txt" 2>&1 &
        fi
    done
    wait
    for f in benchmarks/gpu_findings/*.json; do
        name=$(basename "$f" .json)
        if [[ $(impl_of "$f") == sdpa* ]]; then
            # per backend, forward and with gradients, each in its own worker; then the default
            # dispatch's pick and each backend's finiteness (finding 11: which one returns inf)
            timeout 200 python3 benchmarks/gpu_triage.py "$f" --impl sdpa --impl sdpa_math \
                --impl sdpa_flash --impl sdpa_efficient --impl sdpa_cudnn >"$OUT/rows_$name.txt" 2>&1
            timeout 150 python3 benchmarks/sdpa_dispatch.py "$f" >>"$OUT/rows_$name.txt" 2>&1
        else
            timeout 150 python3 benchmarks/probe_rows.py "$f" --vary BLOCK_N=32 --vary scale=none \
                --vary dtype=bfloat16 --vary values=normal >"$OUT/rows_$name.txt" 2>&1
        fi
    done
    for f in "$OUT"/explain_*.txt "$OUT"/before_*.txt "$OUT"/rows_*.txt; do
        echo "-- $f"; cut -c1-220 "$f" | tail -40
    done
elif [[ "$MODE" == fma ]]; then
    step "finding 10: its regression files compiled, this tree / BEFORE / BEFORE without FMA contraction"
    FILES="regressions/0763cfda3c65.json regressions/31366c6d544e.json"
    {
        echo "-- this tree"
        timeout 150 python3 -m fuzzattn.cli replay $FILES --impl triton_fa2 2>&1 | tail -n 4
        if [[ -d "$BEFORE" ]]; then
            for fusion in 1 0; do
                echo "-- BEFORE, TRITON_DEFAULT_FP_FUSION=$fusion"
                (cd "$BEFORE" && TRITON_DEFAULT_FP_FUSION=$fusion PYTHONPATH=. timeout 150 python3 -m \
                    fuzzattn.cli replay $(for f in $FILES; do echo "$OLDPWD/$f"; done) --impl triton_fa2) \
                    2>&1 | tail -n 4 | cut -c1-220
            done
        fi
    } 2>&1 | tee "$OUT/fma.txt"
elif [[ "$MODE" == census ]]; then
    step "kernels, copies and waits per judged case"
    # sdpa_math fp32 (no known upstream defect, so no shrinking or fault in the count), this tree
    # and BEFORE's judge; CENSUS_SPECS adds others, separated by ";" ("sdpa float32;sdpa bfloat16").
    # CENSUS_BEFORE=0 skips BEFORE.
    IFS=';' read -ra EXTRA_SPECS <<< "${CENSUS_SPECS:-}"
    for spec in "sdpa_math float32" "${EXTRA_SPECS[@]}"; do
        set -- $spec
        timeout 200 python3 benchmarks/launch_census.py --impl "$1" --dtype "$2" --cases 200 \
            >"$OUT/census_$1_$2.txt" 2>&1
        cut -c1-160 "$OUT/census_$1_$2.txt" | grep -v Warning | head -24
        if [[ -d "$BEFORE" && "$1" == sdpa_math && "${CENSUS_BEFORE:-1}" != 0 ]]; then
            CENSUS_TREE=$BEFORE timeout 200 python3 benchmarks/launch_census.py --impl "$1" \
                --dtype "$2" --cases 200 >"$OUT/census_before_$1_$2.txt" 2>&1
            echo "-- BEFORE"; cut -c1-160 "$OUT/census_before_$1_$2.txt" | grep -v Warning | head -24
        fi
    done
elif [[ "$MODE" == suite ]]; then
    # In the background, beside the untimed modes after it; a timed mode waits for it first.
    step "the judge's tests on the GPU, failures by name (in the background)"
    # -v: each result is a line as it happens ("[gw3] FAILED tests/...::name"), so the names
    # survive a limit that cuts the run before pytest's summary (call 16 lost them so).
    # SUITE_TESTS (default: the whole suite, as `pytest -n auto` runs it), SUITE_LIMIT seconds,
    # SUITE_PROFILE (default gpu, what a GPU machine gets; dev has the same checks, fewer cases).
    FUZZATTN_PROFILE=${SUITE_PROFILE:-gpu} timeout -s INT "${SUITE_LIMIT:-300}" python3 -m pytest -v \
        -p no:cacheprovider -n "${SUITE_WORKERS:-8}" -rfEs --tb="${SUITE_TB:-line}" --durations=40 \
        ${SUITE_TESTS:-tests} >"$OUT/suite_gpu.txt" 2>&1 &
    SUITE_PID=$!
elif [[ "$MODE" == contention ]]; then
    mkdir -p "$OUT/contention"
    probe() {   # $1 = K, $2 = label, $3 = seconds of set-up allowed, $4... = contention_probe.py arguments
        local k=$1 label=$2 setup=$3 start
        shift 3
        start=$(( $(date +%s) + setup ))
        for i in $(seq 1 "$k"); do
            OMP_NUM_THREADS=1 timeout 150 python3 benchmarks/contention_probe.py "$@" --start-at "$start" \
                >"$OUT/contention/${label}_$i.json" 2>"$OUT/contention/${label}_$i.err" &
        done
        wait
        python3 - "$OUT/contention" "$label" "$k" <<'PY'
import json, sys
from pathlib import Path
rows = []
for p in sorted(Path(sys.argv[1]).glob(f"{sys.argv[2]}_*.json")):
    try:
        rows.append(json.loads(p.read_text().strip().splitlines()[-1]))
    except (ValueError, IndexError):
        pass
rates = sorted(r["per_second"] for r in rows)
total = sum(rates)
print(f"{sys.argv[2]:>24}: {len(rows)}/{sys.argv[3]} processes, {total:10.1f}/s in all, "
      f"per process {rates[0] if rates else 0:.1f}..{rates[-1] if rates else 0:.1f}")
PY
    }
    contention_round() {   # $1 = label prefix, $2 = process counts of the device-part run
        for k in ${CONTENTION_COUNTS:-1 16}; do
            probe "$k" "$1syncs_$k" 12 syncs --seconds 8 | tee -a "$OUT/scaling.txt"
            probe "$k" "$1launches_$k" 12 launches --seconds 8 | tee -a "$OUT/scaling.txt"
        done
        for k in $2; do
            probe "$k" "$1runs_sdpa_$k" 40 runs --seconds 15 --cases 100 --impl sdpa --dtype float32 \
                | tee -a "$OUT/scaling.txt"
        done
        SCALING_SECONDS=20 scale_run 16 "$1fuzz_16" 1600 | tee -a "$OUT/scaling.txt"
    }
    step "contention between CUDA contexts: syncs, launches, the device part alone, whole fuzzers"
    contention_round "" "1 16"
    step "the same under MPS (one scheduling context for every process; started here, stopped after)"
    under_mps contention_round "mps_" "16"
elif [[ "$MODE" == ceiling ]]; then
    step "the host's cores"
    lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|Model name"
    step "sdpa fp32: the same 16 fuzzers with the GPU hidden (CPU only), then on the GPU, K = 1, 8, 16"
    # TRITON_INTERPRET=0: the interpreter (which the image's numpy refuses) is not needed for sdpa.
    SCALE_GPU="" TRITON_INTERPRET=0 scale_run 16 "cpu_only_16" 1300 | tee -a "$OUT/scaling.txt"
    for k in 1 8 16; do scale_run "$k" "final_$k" $(( 1400 + 20 * k )) | tee -a "$OUT/scaling.txt"; done
elif [[ "$MODE" == ab ]]; then
    export SCALE_IMPL=${AB_IMPL:-sdpa_math} SCALE_DTYPE=float32
    step "$SCALE_IMPL fp32, this tree and BEFORE alternately, $SCALING_SECONDS s each"
    round=0     # a K may repeat (AB_COUNTS="16 16": two pairs); each pair its own label and shards
    for k in ${AB_COUNTS:-1 16}; do
        round=$(( round + 1 ))
        scale_run "$k" "${SCALE_IMPL}_after_${k}_$round" $(( 1100 + 100 * k + 40 * round )) \
            | tee -a "$OUT/scaling.txt"
        [[ -d "$BEFORE" ]] && SCALE_TREE=$BEFORE scale_run "$k" "${SCALE_IMPL}_before_${k}_$round" \
            $(( 1120 + 100 * k + 40 * round )) | tee -a "$OUT/scaling.txt"
    done
    unset SCALE_IMPL SCALE_DTYPE
elif [[ "$MODE" == hostprofile ]]; then
    step "where a case's host time goes: sdpa fp32, one process profiled alone, then one of 16"
    for k in 1 16; do
        SCALE_PROFILE_FIRST=1 scale_run "$k" "profiled_$k" $(( 1800 + 20 * k )) | tee -a "$OUT/scaling.txt"
        python3 benchmarks/host_profile.py "$OUT/scaling/profiled_$k/first.stats" --top 45 \
            >"$OUT/host_profile_$k.txt" 2>&1
        head -n 60 "$OUT/host_profile_$k.txt" | cut -c1-170
    done
elif [[ "$MODE" == waits ]]; then
    step "sdpa fp32 fuzzers by how they wait for the GPU (FUZZATTN_CUDA_WAIT), K in WAIT_COUNTS"
    # WAIT_VALUES in order (a value may repeat: each run its own label and shards), for each K.
    round=0
    for k in ${WAIT_COUNTS:-16}; do
        for value in ${WAIT_VALUES:-auto block yield block auto yield}; do
            round=$(( round + 1 ))
            ( export FUZZATTN_CUDA_WAIT=$value
              scale_run "$k" "waits_${value}_${k}_$round" $(( 2200 + 20 * round )) ) | tee -a "$OUT/scaling.txt"
            grep -ho "\"cuda_waits\": [^,]*" "$OUT/scaling/waits_${value}_${k}_$round"/*.json | sort | uniq -c
        done
    done
elif [[ "$MODE" == macs ]]; then
    step "16 sdpa fp32 fuzzers, more cases judged on the host (FUZZATTN_HOST_JUDGE_MACS)"
    sweep FUZZATTN_HOST_JUDGE_MACS macs 1900 ${MACS_VALUES:-2097152 8388608 33554432}
elif [[ "$MODE" == stages ]]; then
    step "wall-clock time per judge stage: sdpa fp32, K = 1 and 16"
    for k in 1 16; do
        SCALE_STAGE_TIMES=1 scale_run "$k" "stages_$k" $(( 2000 + 20 * k )) | tee -a "$OUT/scaling.txt"
    done
    python3 benchmarks/stage_times.py "$OUT"/scaling/stages_1/stage_times_0.json \
        "$OUT"/scaling/stages_16/stage_times_{0,5,10,15}.json | tee "$OUT/stage_times.txt"
elif [[ "$MODE" == rows ]]; then
    step "per implementation and dtype, K = ${ROW_COUNTS:-1 16}, $SCALING_SECONDS s each"
    base=2200
    for row in ${ROWS:-sdpa:bfloat16 sdpa:float16 torch_tiled:float32}; do
        for k in ${ROW_COUNTS:-1 16}; do
            SCALE_IMPL=${row%%:*} SCALE_DTYPE=${row#*:} scale_run "$k" "${row%%:*}_${row#*:}_$k" "$base" \
                | tee -a "$OUT/scaling.txt"
            base=$(( base + k ))      # each run its own shards, whatever K
        done
    done
elif [[ "$MODE" == checks ]]; then
    step "16 sdpa fp32 fuzzers, checks of larger cases on the host or the device (FUZZATTN_HOST_CHECK_ELEMENTS)"
    sweep FUZZATTN_HOST_CHECK_ELEMENTS checks 2100 ${CHECK_VALUES:-0 131072 524288}
elif [[ "$MODE" == mpsfault ]]; then
    # fuzzattn/platform/mps.py on a real MPS server: a Triton kernel's illegal memory access in one
    # process while another judges sdpa; then a process started after the fault.
    step "a real device fault beside an innocent process: without MPS, then under MPS"
    fault_pair() {   # $1 = label
        timeout 90 python3 benchmarks/mps_fault_probe.py innocent --seconds 25 \
            >"$OUT/mpsfault_$1_innocent.txt" 2>&1 &
        local innocent=$!
        sleep 8
        timeout 90 python3 benchmarks/mps_fault_probe.py fault --fault-after 6 \
            >"$OUT/mpsfault_$1_fault.txt" 2>&1
        echo "$1: the faulting process exited $?"
        wait "$innocent"; echo "$1: the innocent process exited $?"
        timeout 90 python3 benchmarks/mps_fault_probe.py innocent --seconds 3 \
            >"$OUT/mpsfault_$1_after.txt" 2>&1
        echo "$1: a process started after both exited $?"
        for f in "$OUT"/mpsfault_"$1"_*.txt; do echo "-- $f"; grep -v Warning "$f" | tail -n 4; done
    }
    # The same through the command line, as users run it: sdpa in-process beside the faulting
    # kernel fuzzed isolated (--timeout), each `fuzzattn fuzz` for up to 25 s.
    cli_pair() {   # $1 = label
        timeout 120 python3 -m fuzzattn.cli fuzz --impl sdpa --dtype float32 --seconds 25 \
            --max-examples 100000 --regressions-dir "$OUT/cli_$1_regressions" \
            >"$OUT/mpsfault_cli_$1_innocent.txt" 2>&1 &
        local innocent=$!
        sleep 10
        timeout 120 python3 -m fuzzattn.cli fuzz --impl tests/isolation_kernels.py:TRITON_OOB \
            --timeout 60 --seconds 25 --regressions-dir "$OUT/cli_$1_regressions" \
            >"$OUT/mpsfault_cli_$1_fault.txt" 2>&1
        echo "cli $1: fuzzattn fuzz of the faulting kernel (isolated) exited $?"
        wait "$innocent"; echo "cli $1: fuzzattn fuzz of sdpa exited $?"
        ls "$OUT/cli_$1_regressions" 2>/dev/null | sed "s/^/cli $1: file written: /"
        for f in "$OUT"/mpsfault_cli_"$1"_*.txt; do echo "-- $f"; grep -v Warning "$f" | tail -n 6 | cut -c1-400; done
    }
    fault_pair plain
    under_mps fault_pair mps
    cli_pair plain
    under_mps cli_pair mps
elif [[ "$MODE" == mpspytest ]]; then
    # fuzzattn/pytest_plugin.py on a real MPS server: a test meeting a device fault stops the
    # session, every xdist worker with it; without MPS that test fails with its crash verdict,
    # its worker is replaced, and the sdpa tests pass (benchmarks/mps_pytest_probe.py).
    step "pytest -n 4: a real device fault among sdpa tests, without MPS, then under MPS"
    pytest_fault() {   # $1 = label
        local start
        start=$(date +%s)
        timeout 150 python3 -m pytest -p no:cacheprovider -n 4 -rfE --tb=line \
            benchmarks/mps_pytest_probe.py >"$OUT/mpspytest_$1.txt" 2>&1
        echo "pytest $1: exited $? after $(( $(date +%s) - start )) s"
        grep -E "Interrupted|passed|failed|FAILED|ERROR|crashed|replacing" "$OUT/mpspytest_$1.txt" \
            | tail -n 12 | cut -c1-300
        timeout 90 python3 benchmarks/mps_fault_probe.py innocent --seconds 3 \
            >"$OUT/mpspytest_$1_after.txt" 2>&1
        echo "pytest $1: a process started after it exited $?"
    }
    pytest_fault plain
    under_mps pytest_fault mps
elif [[ "$MODE" == mps ]]; then
    # The host-bound ceiling: under MPS the 16 processes share one scheduling context, so
    # waiting for the GPU costs little (contention above) and what is left is each case's host work.
    step "16 sdpa fp32 fuzzers under MPS (started here, stopped after): this tree, then BEFORE"
    # MPS_ROUNDS pairs (default 1), the order alternating: this tree first in odd rounds.
    mps_run() {   # $1 = after or before, $2 = the round
        if [[ $1 == after ]]; then
            scale_run 16 "mps_after_16_$2" $(( 1700 + 100 * $2 )) | tee -a "$OUT/scaling.txt"
        elif [[ -d "$BEFORE" ]]; then
            SCALE_TREE=$BEFORE scale_run 16 "mps_before_16_$2" $(( 1750 + 100 * $2 )) \
                | tee -a "$OUT/scaling.txt"
        fi
    }
    mps_pair() {
        local round
        for round in $(seq 1 "${MPS_ROUNDS:-1}"); do
            if (( round % 2 )); then mps_run after "$round"; mps_run before "$round"
            else mps_run before "$round"; mps_run after "$round"; fi
        done
    }
    under_mps mps_pair
fi
done
wait_suite
echo; cat "$OUT/scaling.txt" 2>/dev/null
archive_out
