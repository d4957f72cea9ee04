"""Sum the JSON results of benchmarks/gpu_campaign.py into one markdown report.

    python benchmarks/gpu_report.py gpu_results/ --out benchmarks/GPU_REPORT.md

Per (implementation, dtype): cases judged, seconds, cases/s and refused draws over every run
given; then every distinct finding (implementation and shrunk case) once, with the number of runs
that found it and three classification columns left empty for a person to fill after triage
(`fuzzattn explain FILE --impl NAME` helps): judge error fixed / upstream defect (an
expected-failure file) / kernel bug fixed. A finding an expected-failure file already covers
says which file.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULT_GLOB = "gpu_campaign_*.json"


def result_files(paths) -> list[Path]:
    found = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(path.glob(RESULT_GLOB))
        elif path.is_file():
            found.append(path)
        else:
            raise SystemExit(f"gpu_report: {path}: no such file or directory")
    if not found:
        raise SystemExit(f"gpu_report: no {RESULT_GLOB} under {', '.join(map(str, paths))}")
    return found


def load(paths) -> list[dict]:
    runs = []
    for path in result_files(paths):
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or "campaigns" not in data:
                raise ValueError("not a gpu_campaign result")
        except ValueError as exc:
            raise SystemExit(f"gpu_report: {path}: {exc}") from None
        data["_path"] = path.name
        runs.append(data)
    return runs


def summarise(runs: list[dict]) -> dict:
    """Totals per (impl, dtype) and the distinct findings, in first-seen order."""
    totals: dict[tuple[str, str], dict] = {}
    findings: dict[tuple[str, str], dict] = {}
    for run in runs:
        for c in run["campaigns"]:
            t = totals.setdefault((c["impl"], c["dtype"]),
                                  dict(cases=0, seconds=0.0, refused=0, runs=0, failures=0, errors=0))
            t["cases"] += c["cases"]
            t["seconds"] += c["seconds"]
            t["refused"] += sum(c.get("refused", {}).values())
            t["runs"] += 1
            t["failures"] += len(c.get("failures", []))
            t["errors"] += len(c.get("errors", []))
            for f in c.get("failures", []):
                key = (c["impl"], json.dumps(f["case"], sort_keys=True))
                entry = findings.setdefault(key, dict(f, impl=c["impl"], dtype=c["dtype"], found=0))
                entry["found"] += 1
    return dict(totals=totals, findings=list(findings.values()))


def _cell(value) -> str:
    return " ".join(str("" if value is None else value).split()).replace("|", "\\|")


def render(runs: list[dict]) -> str:
    s = summarise(runs)
    dates = sorted(r["date"] for r in runs)
    versions = sorted({json.dumps(r.get("versions", {}), sort_keys=True) for r in runs})
    devices = sorted({r.get("device", "?") for r in runs})
    lines = ["# GPU campaign report", "",
             f"- runs: {len(runs)} (shards {', '.join(str(r['shard']) for r in runs)}), "
             f"{dates[0]} to {dates[-1]}",
             f"- device: {', '.join(devices)}",
             f"- profile: {', '.join(sorted({r.get('profile', '?') for r in runs}))}; budget "
             f"{sum(r.get('seconds_budget', 0) for r in runs):g} s in all"]
    for v in versions:
        lines.append("- versions: " + ", ".join(f"{k} {val}" for k, val in json.loads(v).items()))
    lines += ["", "## Cases per implementation and dtype", "",
              "| implementation | dtype | cases judged | seconds | cases/s | refused draws | failures |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for (impl, dtype), t in sorted(s["totals"].items()):
        rate = f"{t['cases'] / t['seconds']:.1f}" if t["seconds"] else ""
        lines.append(f"| {impl} | {dtype} | {t['cases']} | {t['seconds']:.0f} | {rate} | "
                     f"{t['refused']} | {t['failures']}" + (f" ({t['errors']} errors)" if t["errors"] else "")
                     + " |")
    total_cases = sum(t["cases"] for t in s["totals"].values())
    lines += ["", f"{total_cases} cases judged in all.", "", "## Findings", ""]
    if not s["findings"]:
        lines.append("None.")
    else:
        lines += ["| implementation | check | error / allowed | case | file | covered by | runs | "
                  "judge error fixed | upstream defect (expected-failure file) | kernel bug fixed |",
                  "|---|---|---|---|---|---|---:|---|---|---|"]
        for f in s["findings"]:
            numbers = (f"{f['error']:.3g} / {f['allowed']:.3g}"
                       if f.get("error") is not None and f.get("allowed") is not None else "")
            file = Path(f["file"]).name if f.get("file") else ""
            lines.append("| " + " | ".join(_cell(x) for x in (
                f["impl"], f["check"], numbers, f["case_text"], file,
                ", ".join(f.get("covered_by", [])), f["found"], "", "", "")) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", help="gpu_campaign JSON files or directories of them")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "GPU_REPORT.md")
    args = p.parse_args(argv)
    text = render(load(args.paths))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
