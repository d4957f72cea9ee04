# Sourced by the GPU call scripts (benchmarks/gpu_*.sh): the output folder, the environment every
# step runs in, step headers, the editable install that makes the entry points (implementations,
# mutants) visible on the image's own torch and triton, and the steps they share: the scaling run,
# the campaign in parts with its summary, and the archive of $OUT.
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FUZZATTN_PROFILE=gpu
step() { echo; echo "== $1 ($(date +%T))"; }

# Bytecode cached under /tmp for every later process (the image's site-packages hold none, and
# each process compiled ~490 modules again: sympy, imported by torch's first autograd.grad, 2.5 s
# of every fuzzer's first 30 s, measured in call 38).
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/fuzzattn-pycache}
unset PYTHONDONTWRITEBYTECODE
step "install"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { echo "editable install failed"; tail -5 "$OUT/install.log"; }
python3 -c "import fuzzattn, hypothesis, torch.fx.experimental.symbolic_shapes" \
    || echo "warm import failed"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l); (( NGPU > 0 )) || NGPU=1

# K in-process fuzzers on GPU 0 for $SCALING_SECONDS s (one thread each, gradients on one case in
# four; SCALE_IMPL and SCALE_DTYPE, default sdpa float32; with SCALE_PALETTES=N process i draws
# with compile palette i mod N), its utilisation sampled meanwhile; one summary line
# (benchmarks/scaling_summary.py). SCALE_TREE runs another checkout's gpu_campaign.py (a before);
# SCALE_GPU="" hides the GPU (the same fuzzers on the CPU alone).
scale_run() {   # $1 = processes, $2 = label, $3 = first shard, $4... = more gpu_campaign.py arguments
    local k=$1 label=$2 base=$3 dir="$OUT/scaling/$2" tree=${SCALE_TREE:-.}
    shift 3
    mkdir -p "$dir"
    nvidia-smi dmon -i 0 -s u -d 1 -c "$SCALING_SECONDS" >"$dir/dmon.txt" 2>&1 &
    for i in $(seq 0 $(( k - 1 ))); do
        local palette=()
        [[ -n "${SCALE_PALETTES:-}" ]] && palette=(--palette $(( i % SCALE_PALETTES )))
        local profiled=()    # SCALE_PROFILE_FIRST=1: process 0 under cProfile (host_profile.py)
        [[ -n "${SCALE_PROFILE_FIRST:-}" && $i == 0 ]] && profiled=(--cprofile "$dir/first.stats")
        # SCALE_STAGE_TIMES=1: every process times its stages (stage_times.py), stage_times_I.json
        [[ -n "${SCALE_STAGE_TIMES:-}" ]] && profiled+=(--stage-times "$dir/stage_times_$i.json")
        # SCALE_WARM_UP=N: N cases judged before the clock (gpu_campaign.py --warm-up)
        [[ -n "${SCALE_WARM_UP:-}" ]] && profiled+=(--warm-up "$SCALE_WARM_UP")
        CUDA_VISIBLE_DEVICES=${SCALE_GPU-0} OMP_NUM_THREADS=1 PYTHONPATH="$tree" timeout $(( SCALING_SECONDS + 60 )) \
            python3 "$tree/benchmarks/gpu_campaign.py" --impl "${SCALE_IMPL:-sdpa}" \
            --dtype "${SCALE_DTYPE:-float32}" --seconds "$SCALING_SECONDS" --shard $(( base + i )) \
            --gradient-every 4 --out "$dir" --regressions-dir "$dir/found" "${palette[@]}" \
            "${profiled[@]}" "$@" >"$dir/log_$i.txt" 2>&1 &
    done
    wait
    python3 benchmarks/scaling_summary.py "$dir" "$k" "$label"
}

# PARTS isolated gpu_campaign.py processes over every implementation and dtype, part p on GPU
# p mod NGPU with shard SHARD_BASE + p, each CAMPAIGN_SECONDS long; started in the background (the
# caller runs what goes beside them, then waits).
campaign_parts() {   # $1 = parts, $2 = seconds, $3 = shard base, $4 = gradient every
    local parts=$1 seconds=$2 base=$3 every=$4
    mkdir -p "$OUT/campaigns"
    for part in $(seq 0 $(( parts - 1 ))); do
        CUDA_VISIBLE_DEVICES=$(( part % NGPU )) OMP_NUM_THREADS=1 timeout $(( seconds + 90 )) \
            python3 benchmarks/gpu_campaign.py --shard $(( base + part )) \
            --seconds "$seconds" --part "$part/$parts" --isolate --timeout 60 \
            --gradient-every "$every" --out "$OUT/campaigns" --regressions-dir "$OUT/found" \
            >"$OUT/campaign_$part.txt" 2>&1 &
    done
}

# After campaign_parts' processes ended: each part's lines, the call's report, the files found.
campaign_summary() {
    tail -n 25 "$OUT"/campaign_*.txt | grep -E "cases|wrote|Error|error" | cut -c1-240 | tail -40
    python3 benchmarks/gpu_report.py "$OUT/campaigns" --out "$OUT/GPU_REPORT_call.md" >/dev/null 2>&1 \
        && grep -E "^\| |total|runs:" "$OUT/GPU_REPORT_call.md" | head -40
    ls "$OUT/found" 2>/dev/null | head -20
}

# Everything under $OUT as one results.tgz (the device tool returns at most 8 files).
archive_out() {
    tar czf /tmp/fuzzattn-gpu.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete \
        && mv /tmp/fuzzattn-gpu.tgz "$OUT/results.tgz"
}
