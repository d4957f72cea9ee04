"""Wall-clock time per stage of a judged case, without a profiler's distortion: the judge's
stages are wrapped with perf_counter accumulators (about a microsecond per call), so Python-heavy
stages are not inflated the way cProfile inflates them, and on a shared GPU the waits show where
they happen (in a read-back stage). `gpu_campaign.py --stage-times FILE` runs under `timing()`
and writes the totals; this module prints them per judged case.

    python benchmarks/stage_times.py FILE [FILE ...]     # one row per file, ms per judged case

Stages nest as the judge calls them: `judge` holds everything below it; `gradients` holds its own
runs, references and read-backs, which are counted in those stages too.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import json
import sys
import time
from pathlib import Path

# (module, attribute, stage): the attribute is replaced where its callers look it up.
WRAPPED = (
    ("fuzzattn.campaigns.campaign", "judge", "judge"),
    ("fuzzattn.judge.judge", "materialize", "materialise"),
    ("fuzzattn.run.runs", "launch", "runs: launch"),
    ("fuzzattn.run.runs", "deliver", "runs: read-back"),
    ("fuzzattn.judge.judge", "oracle", "oracle"),
    ("fuzzattn.judge.judge", "same_precision_reference", "same-precision reference"),
    ("fuzzattn.judge.judge", "moved_together", "references moved"),
    ("fuzzattn.judge.judge", "_nonfinite_rows", "nonfinite check"),    # trees before
    ("fuzzattn.judge.judge", "_value_verdicts", "value checks"),       # value_checks.py
    ("fuzzattn.judge.value_checks", "nonfinite_rows", "nonfinite check"),
    ("fuzzattn.judge.judge", "value_verdicts", "value checks"),
    ("fuzzattn.judge.judge", "same_bits", "determinism compare"),
    ("fuzzattn.judge.judge", "judge_gradients", "gradients"),
    ("fuzzattn.gradients.judge", "oracle_gradients", "gradients: oracle"),
    ("fuzzattn.gradients.judge", "same_precision_gradients", "gradients: reference"),
    ("fuzzattn.gradients.judge", "moved_together", "gradients: references moved"),
    ("fuzzattn.gradients.judge", "_run", "gradients: runs"),
    ("fuzzattn.gradients.judge", "materialize_dout", "gradients: dO materialised"),
    ("fuzzattn.gradients.judge", "_allowances", "gradients: allowances"),
    ("fuzzattn.gradients.judge", "_nonfinite", "gradients: nonfinite check"),
    ("fuzzattn.gradients.judge", "_empty_rows", "gradients: empty rows"),
    ("fuzzattn.gradients.judge", "_values", "gradients: value checks"),
)


@contextlib.contextmanager
def timing():
    """Every stage of WRAPPED wrapped while inside; yields the dict its seconds accumulate in,
    and puts the original functions back after."""
    totals = {stage: 0.0 for _, _, stage in WRAPPED}

    def timed(fn, stage):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[stage] += time.perf_counter() - start
        return wrapper

    originals = []
    try:
        for module, attribute, stage in WRAPPED:
            owner = importlib.import_module(module)
            if not hasattr(owner, attribute):       # a stage another tree's judge names otherwise
                continue
            originals.append((owner, attribute, getattr(owner, attribute)))
            setattr(owner, attribute, timed(getattr(owner, attribute), stage))
        yield totals
    finally:
        for owner, attribute, original in reversed(originals):
            setattr(owner, attribute, original)


def write(path: Path, totals: dict[str, float], cases: int, seconds: float) -> None:
    path.write_text(json.dumps(dict(cases=cases, seconds=seconds, stages=totals), indent=1) + "\n")


def main(argv=None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    if not paths:
        raise SystemExit("usage: python benchmarks/stage_times.py FILE [FILE ...]")
    records = [json.loads(p.read_text()) for p in paths]
    stages = ["all (campaign)"] + [stage for _, _, stage in WRAPPED] + ["outside the judge"]
    print(f"{'stage, ms per judged case':<34}" + "".join(f"{p.parent.name[:14]:>15}" for p in paths))
    for stage in stages:
        row = []
        for r in records:
            per_case = 1000.0 / max(r["cases"], 1)
            value = {"all (campaign)": r["seconds"],
                     "outside the judge": r["seconds"] - r["stages"]["judge"]}.get(
                stage, r["stages"].get(stage, 0.0))
            row.append(f"{value * per_case:15.2f}")
        print(f"{stage:<34}" + "".join(row))
    print(f"{'judged cases':<34}" + "".join(f"{r['cases']:>15}" for r in records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
