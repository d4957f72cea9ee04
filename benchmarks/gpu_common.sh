# Sourced by the GPU call scripts (benchmarks/gpu_*.sh): the output folder, the environment every
# step runs in, step headers, the editable install that makes the entry points (implementations,
# mutants) visible on the image's own torch and triton, and the scaling run they share.
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FUZZATTN_PROFILE=gpu
step() { echo; echo "== $1 ($(date +%T))"; }

step "install"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { echo "editable install failed"; tail -5 "$OUT/install.log"; }
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

# K in-process sdpa fp32 fuzzers on GPU 0 for $SCALING_SECONDS s (one thread each, gradients on one
# case in four), its utilisation sampled meanwhile; one summary line (benchmarks/scaling_summary.py).
scale_run() {   # $1 = processes, $2 = label, $3 = first shard, $4... = more gpu_campaign.py arguments
    local k=$1 label=$2 base=$3 dir="$OUT/scaling/$2"
    shift 3
    mkdir -p "$dir"
    nvidia-smi dmon -i 0 -s u -d 1 -c "$SCALING_SECONDS" >"$dir/dmon.txt" 2>&1 &
    for i in $(seq 0 $(( k - 1 ))); do
        CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=1 timeout $(( SCALING_SECONDS + 60 )) \
            python3 benchmarks/gpu_campaign.py --impl sdpa --dtype float32 \
            --seconds "$SCALING_SECONDS" --shard $(( base + i )) --gradient-every 4 --out "$dir" \
            --regressions-dir "$dir/found" "$@" >"$dir/log_$i.txt" 2>&1 &
    done
    wait
    python3 benchmarks/scaling_summary.py "$dir" "$k" "$label"
}
