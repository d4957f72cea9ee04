# Sourced by the GPU call scripts (benchmarks/gpu_call.sh, benchmarks/gpu_triage.sh): the output
# folder, the environment every step runs in, step headers, and the editable install that makes
# the entry points (implementations, mutants) visible on the image's own torch and triton.
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FUZZATTN_PROFILE=gpu
step() { echo; echo "== $1 ($(date +%T))"; }

step "install"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { echo "editable install failed"; tail -5 "$OUT/install.log"; }
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
