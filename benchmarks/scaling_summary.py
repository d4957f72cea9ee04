"""One line summing a scaling run of benchmarks/gpu_probe.sh or gpu_campaign_call.sh: the judged
cases of K concurrent gpu_campaign.py processes (their JSON results in DIR), over the longest
campaign's seconds, and the median SM utilisation nvidia-smi dmon sampled meanwhile.

    python benchmarks/scaling_summary.py DIR K LABEL
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def summary(directory: Path, processes: int, label: str) -> str:
    runs = [json.loads(p.read_text()) for p in sorted(directory.glob("gpu_campaign_*.json"))]
    campaigns = [c for run in runs for c in run["campaigns"]]
    cases = sum(c["cases"] for c in campaigns)
    seconds = max((c["seconds"] for c in campaigns), default=0.0)
    dmon = directory / "dmon.txt"
    util = sorted(int(line.split()[1]) for line in (dmon.read_text().splitlines() if dmon.exists() else [])
                  if line.split() and line.split()[0].isdigit())
    median = util[len(util) // 2] if util else -1
    rate = cases / seconds if seconds else 0.0
    return (f"{label:>16}: {processes:2d} processes, {len(runs):2d} results, {cases:6d} cases in "
            f"{seconds:5.1f} s = {rate:7.1f} cases/s; GPU sm% median {median}")


if __name__ == "__main__":
    print(summary(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
