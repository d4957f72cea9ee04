"""The installed `fuzzattn` command: every judging command (fuzz, gate, mutants, replay, explain)
runs watched in a child process (fuzzattn/isolation/watchdog.py), at full in-process speed.

When the child dies by a signal, faults the GPU or overruns a call's deadline, the case in flight
is written as a regression file with the verdict segfault / device_fault / hang, the verdict and
the replay command are printed, and the exit status is 1. A segfault or device fault found by a
campaign is then shrunk by running that campaign again isolated (each case in a worker process);
a hang is kept as found, since every try of a shrink would wait out the deadline. With
--keep-going the whole command runs again isolated instead, so that every campaign finishes; that
run shrinks the crash, and its shrunk file replaces the case as found.
`mutants` always does so, saving and shrinking nothing: a mutant's crash is its kill.
`fuzz` and `gate` carry on past a crash in one of their worker processes (CARRY_ON): each prints
its whole table, then every distinct crash its campaigns met is saved and shrunk. `replay` carries
on too. A crash met replaying a file (by `replay`, `explain` or the gate) is that file's row,
never saved again: its case is a file already. A crash of replay's or explain's own process,
which leaves no table, has the command run again isolated (FROM_FILES).

FUZZATTN_SUPERVISE=off runs the command in this process (a crash then ends the run), as
`fuzzattn.cli.main(argv)` always does.
"""
from __future__ import annotations

import builtins
import functools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

WATCHED = ("fuzz", "gate", "mutants", "replay", "explain")
# Commands that carry on past a crash in one of their --workers processes: the pool starts new
# ones, the command prints its whole table, and every crash its campaigns met is saved (and
# shrunk) after it; a replay's crash is its file's row. A crash of the command's own process
# still ends it.
CARRY_ON = ("fuzz", "gate", "replay")
# Commands that judge regression files' cases: a crash there is never saved as a new file.
FROM_FILES = ("replay", "explain")
OFF_ENV = "FUZZATTN_SUPERVISE"
SHRINK_SECONDS = 120.0      # the most an isolated shrink of a found crash may take


def console_main(argv=None) -> int:
    """The `fuzzattn` command; an internal error, here as in the child, is one line and status
    70 (fuzzattn.cli.internal_error), never a traceback with status 1, a finding's."""
    from fuzzattn.cli import guarded
    return guarded(_console_main, list(sys.argv[1:] if argv is None else argv))


def _console_main(argv: list[str]) -> int:
    from fuzzattn.cli import build_parser, main
    from fuzzattn.cli.common import CLIError, flattened
    from fuzzattn.isolation import watchdog
    from fuzzattn.platform import compile_pools, flight

    compile_pools.release_at_exit()
    if flight.watched_here():
        watchdog.install_fault_log()
        return main(argv)
    if os.environ.get(OFF_ENV, "").lower() in ("0", "off", "no", "false"):
        return main(argv)
    try:
        args = build_parser().parse_args(argv)
    except CLIError as exc:
        print(f"fuzzattn: error: {flattened(exc)}", file=sys.stderr)
        return 2
    except SystemExit as exc:          # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    if args.command not in WATCHED:
        return main(argv)
    carry_on = args.command in CARRY_ON
    ending = watchdog.run_watched(command(argv), timeout=_watch_timeout(args),
                                  stop_at_first=not carry_on)
    crash = ending.crash
    if crash is None:
        if ending.died:         # not a finding (no case was in flight), not a usage error
            from fuzzattn.cli import INTERNAL_ERROR_STATUS
            print(f"fuzzattn: error: {ending.died}", file=sys.stderr)
            return INTERNAL_ERROR_STATUS
        return ending.returncode
    if args.command == "mutants" and "--isolate" not in argv:
        return _mutants_again_isolated(crash, argv, args)
    from fuzzattn.platform.flight import DEVICE_FAULT_EXIT
    ended_itself = ending.returncode >= 0 and ending.returncode != DEVICE_FAULT_EXIT
    if args.command in FROM_FILES:
        return _from_files(crash, ended_itself, ending.returncode, argv, args)
    again = getattr(args, "keep_going", False) and not (carry_on and ended_itself)
    crashes = _distinct(ending.crashes) if carry_on else [crash]
    if carry_on and ended_itself:
        # A crash met replaying a file (no campaign named in its record) is that file's row of
        # the table printed: its case is a file already, and there is no campaign to shrink.
        crashes = [c for c in crashes if c.record.get("context")]
    saved = [(c, save_crash(c, args)) for c in crashes]
    if again:
        # The isolated run reaches the same crash from the same seed and shrinks it there: a
        # shrink here first would pay every crash's worker restart twice.
        before = _saved_files(saved)
        status = _again_isolated(argv, args, "fuzzattn: carrying on, isolated")
        _drop_superseded(saved, before)
        return max(1, status)
    for crash, written in saved:
        if crash.check != "hang" and crash.record.get("context"):
            shrink(crash, written)
    return 1


def _from_files(crash, ended_itself: bool, returncode: int, argv: list[str], args) -> int:
    """A crash on a regression file's case is a row of the command's table, never a new file (the
    file holds the case already, and a copy of it in the default directory would be replayed as
    a second defect). A crash in one of replay's --workers processes: the command replayed that
    worker's files again, each isolated, and printed its table. A crash of the command's own
    process left no table: it runs again isolated (every file, every explain variant), where a
    crash is a verdict. explain's status stays its own (0 once its table is printed)."""
    if not ended_itself:
        print(f"\nfuzzattn: {crash.record.get('impl', 'an implementation')} ended the "
              f"{args.command} ({crash.check}: {crash.detail})", file=sys.stderr, flush=True)
        returncode = _again_isolated(argv, args, f"fuzzattn: {args.command} again, isolated")
    return returncode if args.command == "explain" else max(1, returncode)


def _saved_files(saved: list) -> set:
    from fuzzattn.campaigns.regression_file import discover
    return {path for _, written in saved if written is not None
            for path in discover(Path(written.path).parent)}


def _drop_superseded(saved: list, before: set) -> None:
    """Remove a crash's file as found once the isolated run has saved its own (shrunk) file for
    the same implementation and check: one file per defect."""
    from fuzzattn.campaigns.regression_file import display_path
    for crash, written in saved:
        if written is None or not written.new:
            continue
        shrunk = [path for path, _ in _same_defect(Path(written.path).parent, crash) if path not in before]
        if shrunk:
            Path(written.path).unlink(missing_ok=True)
            print(f"fuzzattn: the isolated run saved the {crash.check} shrunk, "
                  f"{display_path(shrunk[0])}, in place of {display_path(written.path)}", flush=True)


def _crashes_alone(path, spec: str) -> bool:
    """Whether the regression file at `path` fails again when replayed alone, in a fresh
    isolated worker (a file recording a crash always replays isolated)."""
    from fuzzattn.isolation import watchdog
    done = watchdog.run_watched(command(["replay", str(path), "--impl", spec]),
                                limit=SHRINK_SECONDS, quiet=True)
    return done.returncode == 1 or bool(done.crashes)


def _same_defect(directory, crash) -> list:
    """(path, record) of each readable regression file of `directory` that records `crash`'s
    implementation and check."""
    from fuzzattn.campaigns.regression_file import loadable
    return [(path, record) for path, record in loadable(directory)
            if record.impl == crash.record.get("impl") and record.check == crash.check]


def _distinct(crashes: list) -> list:
    """One crash per implementation and case, in the order seen."""
    seen, kept = set(), []
    for crash in crashes:
        key = (crash.record.get("impl"), json.dumps(crash.record.get("case"), sort_keys=True))
        if key not in seen:
            seen.add(key)
            kept.append(crash)
    return kept


def _again_isolated(argv: list[str], args, why: str) -> int:
    """Run the command again with --isolate, where a crash is a verdict; its exit status (1 if
    the rerun itself died)."""
    from fuzzattn.isolation import watchdog
    again = argv if "--isolate" in argv else argv + ["--isolate"]
    print(f"{why}: fuzzattn {' '.join(again)}", file=sys.stderr, flush=True)
    rerun = watchdog.run_watched(command(again), timeout=_watch_timeout(args))
    return rerun.returncode if rerun.returncode >= 0 else 1


def _mutants_again_isolated(crash, argv: list[str], args) -> int:
    """A planted bug that crashes, hangs or faults the process is killed by it, not a finding to
    save: the zoo is judged again isolated, where that is a verdict in the kill table and every
    other mutant is still fuzzed (in the watched run the crash ended them all)."""
    return _again_isolated(argv, args, f"fuzzattn: {crash.record.get('impl', 'a mutant')} ended "
                           f"the process ({crash.check}); judging again isolated, where that is a kill")


def command(argv: list[str]) -> list[str]:
    from fuzzattn.isolation.watchdog import python_command
    return python_command("fuzzattn.cli.watched", "console_main", argv)


def _watch_timeout(args) -> float | None:
    # Isolated, the workers keep their own deadline: the watched child makes no kernel call.
    return None if getattr(args, "isolate", False) else getattr(args, "timeout", None)


def judged_crash(crash):
    """The crash as a failing JudgedCase, its inputs materialised here for the sha256."""
    from fuzzattn.contract.case import AttentionCase
    from fuzzattn.inputs.materialize import inputs_sha256, materialize
    from fuzzattn.judgement.judge import JudgedCase
    from fuzzattn.judging.verdict import Verdict
    from fuzzattn.platform.versions import versions
    record = crash.record
    case = AttentionCase.from_dict(record["case"])
    stage = "in the backward: " if record.get("stage") == "backward" else ""
    verdict = Verdict(impl=record["impl"], case=case, check=crash.check, passed=False,
                      detail=stage + crash.detail)
    return JudgedCase(record["impl"], case, [verdict], cli_name=record["spec"],
                      versions=versions(), inputs_sha256=inputs_sha256(materialize(case, "cpu")))


def save_crash(crash, args=None, directory=None, stream=None):
    """Write the case in flight as a regression file (unless --no-save) and print the verdict
    and the replay command; returns the Written file or None."""
    from fuzzattn.campaigns.campaign import save
    from fuzzattn.campaigns.regression_file import default_dir, display_path, replay_command
    judged = judged_crash(crash)
    context = crash.record.get("context") or {}
    directory = (directory or context.get("regressions_dir") or getattr(args, "regressions_dir", None)
                 or default_dir())
    out = stream or sys.stdout
    print = functools.partial(builtins.print, file=out)
    print("\n" + judged.describe(), flush=True)
    written = None
    if not getattr(args, "no_save", False):
        written = save(judged, directory)
        print(f"  regression file: {display_path(written.path)}")
        if written.fallback_reason:
            print(f"  (fallback location: {written.fallback_reason})")
        replay = replay_command(written.path, judged.cli_name)
        if crash.check == "hang":       # the replay waits as long as the run did, no longer
            replay += f" --timeout {crash.record['timeout']:g}"
        print(f"  replay:  {replay}", flush=True)
    return written


def shrink(crash, written) -> None:
    """Run the crashed campaign again isolated, from the same Hypothesis seed, so Hypothesis
    reaches the case again and shrinks it in worker processes; the shrunk file replaces the one
    just written when it records the same check and fails again replayed on its own. With no
    example database: the default one beside the scratch directory is /tmp's, shared by every
    shrink on the machine, and its saved cases, replayed first, left a shrink at Nq=17 where the
    seed alone reaches Nq=3."""
    from fuzzattn.campaigns.regression_file import display_path
    from fuzzattn.isolation import watchdog
    context = crash.record["context"]
    scratch = tempfile.mkdtemp(prefix="fuzzattn-shrink-")
    try:
        argv = ["fuzz", "--impl", crash.record["spec"], "--isolate",
                "--hypothesis-seed", str(context["hypothesis_seed"]),
                "--profile", context["profile"],
                "--regressions-dir", scratch, "--database", "off"]
        if context.get("max_examples"):
            argv += ["--max-examples", str(context["max_examples"])]
        if context.get("dtype"):
            argv += ["--dtype", context["dtype"]]
        if context.get("seconds"):
            argv += ["--seconds", f"{context['seconds']:g}"]
        print(f"fuzzattn: shrinking the {crash.check} isolated: fuzzattn {' '.join(argv)}",
              flush=True)
        done = watchdog.run_watched(command(argv), limit=SHRINK_SECONDS, quiet=True)
        same = _same_defect(scratch, crash)
        if done.limit or not same or written is None:
            print(f"fuzzattn: the {crash.check} was not shrunk; the case as found is kept", flush=True)
            return
        path, record = min(same, key=lambda pr: (pr[1].case.batch * pr[1].case.heads
                                                  * pr[1].case.seq_q * pr[1].case.seq_k))
        if not _crashes_alone(path, crash.record["spec"]):
            # A worker judges many cases: memory an earlier case corrupted can kill it on a
            # later, innocent one, which the shrink then shrinks. A file must replay its check.
            print(f"fuzzattn: the shrunk case ({record.case}) did not {crash.check} again on its "
                  f"own; the case as found is kept", flush=True)
            return
        target = Path(written.path).parent / path.name
        if not target.exists():
            shutil.copyfile(path, target)
        if written.new and Path(written.path) != target:
            Path(written.path).unlink(missing_ok=True)
        print(f"fuzzattn: shrunk to {record.case}\n  regression file: {display_path(target)}",
              flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
