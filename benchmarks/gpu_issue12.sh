#!/usr/bin/env bash
# Issue 12 on a GPU, in one call: replay regressions/ (the cuDNN boolean-mask leak files must be
# xfail for sdpa and sdpa_cudnn, every other backend ok or skip), triage them with `explain`, then
# a time-boxed campaign over every registered implementation and dtype, summed into a report.
#     bash benchmarks/gpu_issue12.sh [SECONDS]          # campaign budget, default 400
# Run it again to add another shard: the campaign JSONs under $OUT/campaigns add up in the report.
set -uo pipefail
OUT=${OUT:-gpu-out}
BUDGET=${1:-400}
mkdir -p "$OUT/campaigns"
# this checkout's fuzzattn and kernels, whatever the image has installed
export PYTHONUNBUFFERED=1 FUZZATTN_PROFILE=gpu PYTHONPATH=$PWD
fuzzattn() { python3 -m fuzzattn.cli "$@"; }
step() { echo; echo "== $1 ($(date +%T))"; }

step "replay regressions/ on every implementation"
fuzzattn replay regressions/ 2>&1 | tail -70 | tee "$OUT/replay.txt"
step "explain the leak files"
for f in $(grep -l '"sdpa_cudnn"' regressions/*.json); do fuzzattn explain "$f" --impl sdpa_cudnn; done \
    2>&1 | tee "$OUT/explain_sdpa_cudnn.txt"
for f in $(grep -l '"device": "cuda"' regressions/*.json); do fuzzattn explain "$f" --impl sdpa; done \
    2>&1 | tee "$OUT/explain_sdpa.txt"
step "campaign, $BUDGET s"
python3 benchmarks/gpu_campaign.py --seconds "$BUDGET" --out "$OUT/campaigns" 2>&1 | tee -a "$OUT/campaign.txt"
python3 benchmarks/gpu_report.py "$OUT/campaigns" --out "$OUT/GPU_REPORT.md" && cat "$OUT/GPU_REPORT.md"
