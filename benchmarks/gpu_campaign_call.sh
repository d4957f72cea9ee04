#!/usr/bin/env bash
# A GPU call after a judge change: process scaling measured again on a quiet GPU (as in
# gpu_probe.sh, to compare), then a campaign of PARTS isolated parts over every implementation and
# dtype spread over the visible GPUs, with beside it the changed regression files replayed per
# implementation, the remaining finding attributed (benchmarks/sdpa_dispatch.py) and explained.
#     bash benchmarks/gpu_campaign_call.sh [CAMPAIGN_SECONDS=240] [PARTS=28] [SHARD_BASE=300] [SCALING_SECONDS=30]
set -uo pipefail
CAMPAIGN_SECONDS=${1:-240}
PARTS=${2:-28}
SHARD_BASE=${3:-300}
SCALING_SECONDS=${4:-30}
source "$(dirname "$0")/gpu_common.sh"

if (( SCALING_SECONDS > 0 )); then
    step "scaling over processes on one GPU, sdpa fp32, $SCALING_SECONDS s each"
    for k in 1 16; do scale_run "$k" "inproc_$k" 500 | tee -a "$OUT/scaling.txt"; done
fi

step "campaign: $PARTS isolated parts x $CAMPAIGN_SECONDS s on $NGPU GPU(s); beside it replay and attribution"
campaign_parts "$PARTS" "$CAMPAIGN_SECONDS" "$SHARD_BASE" 4
CHANGED=${CHANGED:-}
(
    [[ -n "$CHANGED" ]] && timeout 200 python3 -m fuzzattn.cli replay $CHANGED --isolate --timeout 90 \
        >"$OUT/replay_changed.txt" 2>&1
    shopt -s nullglob; FINDINGS=(benchmarks/gpu_findings/*.json)
    (( ${#FINDINGS[@]} )) && timeout 120 python3 benchmarks/sdpa_dispatch.py "${FINDINGS[@]}" >"$OUT/dispatch.txt" 2>&1
    for impl in sdpa sdpa_math sdpa_cudnn sdpa_efficient; do
        timeout 150 python3 -m fuzzattn.cli replay regressions/ --impl "$impl" --isolate --timeout 60 \
            >"$OUT/replay_$impl.txt" 2>&1
    done
) &
wait
campaign_summary
cat "$OUT/replay_changed.txt" 2>/dev/null | grep -vE "^-" | cut -c1-200 | tail -12
cat "$OUT/dispatch.txt" 2>/dev/null | cut -c1-200
for f in "$OUT"/replay_sdpa*.txt; do echo "-- $f"; tail -n 1 "$f"; grep -E " FAIL | XPASS" "$f" | cut -c1-160; done
echo; cat "$OUT/scaling.txt" 2>/dev/null
archive_out
