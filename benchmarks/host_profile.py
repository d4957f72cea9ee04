"""Where a judged case's host time goes: a cProfile stats file (`gpu_campaign.py --cprofile`)
summarised in milliseconds per judged case — the stages of throughput.py, then the functions with
the most time of their own and the most time under them.

    python benchmarks/host_profile.py STATS [--cases N] [--top 30]

N defaults to the count gpu_campaign.py wrote beside the stats (STATS.cases).

Not a test: it prints numbers. cProfile inflates Python-heavy stages (every call pays the
profiler's hook), so compare the stages with each other, not with an unprofiled rate.
"""
from __future__ import annotations

import argparse
import pstats
import sys
from pathlib import Path

# Functions whose cumulative time makes up each stage (file suffix, function name); a stage
# nested inside another (the oracle inside judging) is counted in both, as cumulative times are.
STAGES = {
    "draw (strategies)": ("cases.py", "_cases"),
    "materialise": ("inputs.py", "materialize"),
    "implementation runs (launch)": ("runs.py", "launch"),
    "read-backs of runs": ("runs.py", "deliver"),
    "float64 oracle + reference": ("oracle.py", "_attend"),
    "value checks": ("value_checks.py", "value_verdicts"),
    "gradients": ("gradients.py", "judge_gradients"),
    "judge_once (all judging)": ("campaign.py", "judge_once"),
    "fuzz (everything)": ("campaign.py", "fuzz"),
}


def cases_beside(stats: Path) -> int:
    counted = Path(f"{stats}.cases")
    try:
        return int(counted.read_text())
    except (OSError, ValueError):
        raise SystemExit(f"host_profile: no judged-case count in {counted}: give --cases N") from None


def stage_ms(stats: dict, cases: int, stages: dict = STAGES) -> dict[str, float]:
    """Milliseconds per judged case of each stage: the cumulative time of its function, from
    pstats' raw table (`pstats.Stats(...).stats`); also throughput.py's breakdown."""
    return {stage: 1000.0 * sum(v[3] for (file, _, func), v in stats.items()
                                if file.endswith(suffix) and func == name) / max(cases, 1)
            for stage, (suffix, name) in stages.items()}


def summarise(stats_path: Path, cases: int, top: int) -> str:
    stats = pstats.Stats(str(stats_path)).stats
    per_case = 1000.0 / max(cases, 1)
    lines = [f"{stats_path}: {cases} judged cases; milliseconds per judged case"]
    lines += [f"  {stage:<32}{ms:9.2f}" for stage, ms in stage_ms(stats, cases).items()]

    def label(key):
        file, line, func = key
        return f"{Path(file).name}:{line}({func})" if line else func

    for title, column in (("own time", 2), ("cumulative", 3)):
        lines.append(f"-- top {top} by {title}")
        ranked = sorted(stats.items(), key=lambda kv: kv[1][column], reverse=True)[:top]
        for key, value in ranked:
            lines.append(f"  {value[column] * per_case:9.3f} ms  {value[1]:>9} calls  {label(key)[:110]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stats", type=Path)
    parser.add_argument("--cases", type=int, help="judged cases the profile covers (default: STATS.cases)")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    cases = args.cases if args.cases is not None else cases_beside(args.stats)
    print(summarise(args.stats, cases, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
