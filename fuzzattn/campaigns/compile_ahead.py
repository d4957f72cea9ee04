"""Compile-ahead: a rotating campaign's next palette compiled while it judges the current one.

Compiled Triton writes every binary it builds to its on-disk cache (TRITON_CACHE_DIR, by default
~/.triton/cache), and inductor its generated code and compiled graphs (TORCHINDUCTOR_CACHE_DIR);
a process meeting a variant already there loads it in milliseconds instead of compiling it for
seconds. While a rotating campaign (campaigns/rotation.py) judges palette p, a process draws
cases of the palette it moves to next and runs the implementation on them without judging
anything, so that those caches hold the next palette's binaries when the campaign gets there;
the campaign, moving on, waits for that warm-up to end (at most WAIT s, never past its time
cap) rather than compiling the same binaries beside it.

It is opt-in (FUZZATTN_COMPILE_AHEAD=on): its gain is one measurement so far (a cold triton_fa2
campaign over 16 workers judged 25 cases/s with it, 19 without: benchmarks/REPORT.md), and a
warm-up competes with the judging processes for the cores compiling needs. A campaign never
waits for a warm-up past its own time cap, and a warm-up draws no more cases than a turn holds.

`compile_ahead` starts no pool (returns None) where it is off or cannot help:
- interpreted Triton (no GPU, or TRITON_INTERPRET=1): nothing is compiled, only run, so a
  warm-up would only take a core from the judging;
- an implementation that is neither a compiled Triton kernel nor declares `compiles_per_shape`:
  nothing is compiled per variant (SDPA's per-shape plans, `plans_per_shape`, live in the
  process that builds them, not on disk: another process cannot build them for it);
- FUZZATTN_COMPILE_AHEAD=off (the default).
A campaign whose case budget ends within its current turn warms no next palette
(rotation.RotatingCases.begin); one ended by time alone cannot know, and warms it.
"""
from __future__ import annotations

import multiprocessing
import os
import time

ENV = "FUZZATTN_COMPILE_AHEAD"
CASES = 200         # drawn per warmed palette: what the campaign's first cases there would compile
WAIT = 120.0        # seconds a campaign moving on waits at most for its palette's warm-up


def compile_ahead(impl, dtype: str | None, profile: str,
                  turn_cases: int = CASES) -> "CompileAhead | None":
    """A compile-ahead pool for `impl`'s rotating campaign of `turn_cases` cases a palette, or
    None where it is off or cannot help."""
    from fuzzattn.triton_interpreter.backend import is_interpreted
    mode = ahead_mode()
    compiles = impl.caps.compiles_per_shape or (impl.backend == "triton" and not is_interpreted())
    if mode == "off" or not compiles:
        return None
    return CompileAhead(impl.cli_name, dtype, profile, cases=min(CASES, turn_cases))


def ahead_mode() -> str:
    """FUZZATTN_COMPILE_AHEAD: `off` (the default) or `on` (where it can help)."""
    mode = os.environ.get(ENV, "off") or "off"
    if mode not in ("on", "off"):
        raise ValueError(f"{ENV}={mode!r} is not one of on, off")
    return mode


class CompileAhead:
    """Warm-up processes for the palettes `warm` names: one spawned process a palette (spawn: a
    forked CUDA context is unusable; its start-up, seconds, is small beside the compiles; not a
    daemon: inductor starts compile workers of its own), so at
    most two run at once, one finishing the palette the campaign has just moved to, one
    starting the next. `close` ends those still running: none outlives the campaign."""

    def __init__(self, spec: str, dtype: str | None, profile: str, *, cases: int = CASES,
                 wait: float = WAIT):
        self.spec, self.dtype, self.profile, self.cases, self.wait = spec, dtype, profile, cases, wait
        self.pending: dict[int, tuple] = {}        # palette -> (process, its end of a pipe)

    def warm(self, palette: int) -> None:
        """Start warming the caches for `palette` (unless already asked for)."""
        if palette in self.pending:
            return
        context = multiprocessing.get_context("spawn")
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_warm_main, name=f"compile-ahead {palette}",
                                  args=(send, self.spec, self.dtype, self.profile, palette,
                                        self.cases))
        process.start()
        send.close()
        self.pending[palette] = (process, receive)

    def ready(self, palette: int, until: float | None = None) -> int | None:
        """Wait (at most `wait` s, and never past perf_counter() `until`: the campaign's time
        cap) for `palette`'s warm-up; the cases it ran, None if it was never asked for, is still
        running (left to go on warming) or failed (the campaign then compiles for itself: a
        warm-up's failure is no finding, the campaign judges those cases)."""
        if palette not in self.pending:
            return None
        process, receive = self.pending[palette]
        wait = self.wait if until is None else max(0.0, min(self.wait, until - time.perf_counter()))
        if not receive.poll(wait):
            return None
        del self.pending[palette]
        try:
            ran = receive.recv()
        except EOFError:                 # it died without an answer
            ran = None
        process.join()
        receive.close()
        return ran

    def close(self) -> None:
        for process, receive in self.pending.values():
            process.terminate()
            process.join()
            receive.close()
        self.pending.clear()


def _warm_main(send, *args) -> None:
    try:
        send.send(warm_palette(*args))
    finally:
        send.close()


def warm_palette(spec: str, dtype: str | None, profile: str, palette: int, cases: int) -> int:
    """In a pool process: draw `cases` cases of `palette` and run `spec` on them, gradients too
    where declared, judging nothing. Returns how many ran; a case that raises is skipped (a
    refusal, or a bug the campaign will judge when it draws it)."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    from fuzzattn.contract.profiles import PROFILES
    from fuzzattn.inputs.materialize import materialize, materialize_dout
    from fuzzattn.judgement.judge import default_device
    from fuzzattn.run.loader import load_implementation
    from fuzzattn.run.registry import get
    from fuzzattn.strategies.cases import attention_cases

    impl = load_implementation(spec, probe=False) if ":" in spec else get(spec)
    drawn = []

    @seed(palette)
    @settings(max_examples=cases, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(attention_cases(impl.caps, dtype=dtype, profile=PROFILES[profile], palette=palette))
    def draw(case):
        drawn.append(case)

    draw()
    device, ran = default_device(), 0
    for case in drawn:
        try:
            q, k, v = materialize(case, device).tensors()
            out, lse = impl(q, k, v, case)
            if impl.caps.backward:
                impl.gradients(q, k, v, materialize_dout(case, device)[1], case, out=out, lse=lse)
        except Exception:     # noqa: BLE001 (see the docstring)
            continue
        ran += 1
    return ran
