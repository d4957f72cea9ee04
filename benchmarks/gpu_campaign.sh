#!/usr/bin/env bash
# The GPU campaign in one call: install, replay regressions/ (the cuDNN leak files are expected
# failures there), triage them with `explain`, then SHARDS concurrent campaign processes (distinct
# shards: distinct Hypothesis seeds), each fuzzing every registered implementation and dtype for
# SECONDS, summed into a report. The host's 16 cores drive one GPU: one process alone leaves it
# mostly idle (benchmarks/THROUGHPUT.md).
#     bash benchmarks/gpu_campaign.sh [SECONDS per shard, default 360] [SHARDS, default 8]
set -uo pipefail
OUT=${OUT:-gpu-out}
SECONDS_PER_SHARD=${1:-360}
SHARDS=${2:-8}
mkdir -p "$OUT/campaigns"
export PYTHONUNBUFFERED=1 FUZZATTN_PROFILE=gpu
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { echo "editable install failed"; tail -5 "$OUT/install.log"; }
fuzzattn() { python3 -m fuzzattn.cli "$@"; }
step() { echo; echo "== $1 ($(date +%T))"; }

step "replay regressions/ on every implementation (compiled)"
timeout 100 python3 -m fuzzattn.cli replay regressions/ >"$OUT/replay.txt" 2>&1
grep -E "xfail|XPASS|FAIL|drifted|regression file\(s\)" "$OUT/replay.txt" | tail -20
step "explain the cuDNN leak files"
for f in $(grep -l '"sdpa_cudnn"' regressions/*.json); do
    timeout 40 python3 -m fuzzattn.cli explain "$f" --impl sdpa_cudnn
done 2>&1 | tee "$OUT/explain.txt" | tail -30

step "campaign: $SHARDS shards x $SECONDS_PER_SHARD s"
for shard in $(seq 0 $(( SHARDS - 1 ))); do
    OMP_NUM_THREADS=$(( 16 / SHARDS )) python3 benchmarks/gpu_campaign.py --seconds "$SECONDS_PER_SHARD" \
        --shard "$shard" --out "$OUT/campaigns" --regressions-dir "$OUT/found" \
        >"$OUT/campaign_$shard.txt" 2>&1 &
done
wait
tail -3 "$OUT"/campaign_*.txt
python3 benchmarks/gpu_report.py "$OUT/campaigns" --out "$OUT/GPU_REPORT.md" && cat "$OUT/GPU_REPORT.md"
ls "$OUT/found" 2>/dev/null | head -20
# The device tool brings back at most 8 files: everything in one archive.
tar czf /tmp/fuzzattn-gpu.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/fuzzattn-gpu.tgz "$OUT/results.tgz"
