"""Judge one implementation on one case: run it, compute references, and return named verdicts.

Order matters (after robust-kbench): the implementation runs first, on freshly materialised
inputs, before any reference touches the device; the references run on their own fresh copies;
then the implementation runs again on fresh copies. A kernel therefore cannot pass by returning
memory a reference left behind, and the second run doubles as the determinism check. (When the
references compute on the host while the implementation runs on an accelerator, no reference
touches the device at all, and the second run follows the first at once: `_runs_together`. When
they compute on the accelerator and the checks on the host, the second run follows them there,
and both runs and the references are read back together: `_read_back_with_references`.)

Judged on the host, the same-precision reference is computed only if a check asks for it (an
error above its noise alone: tolerance.py's tiers), so possibly after the second run; it reads
the pristine inputs only, as every reference does, and nothing of a run can reach it.

The runs themselves, adversarial and plain, and their side-effect checks: fuzzattn/run/runs.py; the
value checks of a run against the references: fuzzattn/judgement/value_checks.py.
"""
from __future__ import annotations

import dataclasses
import functools
import sys

import torch

from fuzzattn.contract.case import AttentionCase
from fuzzattn.contract.implementation import Implementation
from fuzzattn.run import execute
from fuzzattn.run import pruning, runs
from fuzzattn.platform import shared_gpu
from fuzzattn.gradients.gradient_verdicts import judge_gradients
from fuzzattn.inputs.budget import check_budget
from fuzzattn.inputs.materialize import (Inputs, born_on_device, inputs_sha256,
                                     materialize)
from fuzzattn.judging.placement import (check_device, judge_device, judging, moved_together,
                                          rebuilt, tensors_in)
from fuzzattn.judging.oracle import Reference, oracle, same_precision_reference, visibility
from fuzzattn.run.runs import same_bits
from fuzzattn.inputs.transfer import same_device
from fuzzattn.judgement.value_checks import attribute_nonfinite, run_on, value_verdicts
from fuzzattn.judging.verdict import CHECKS, Verdict, heatmap, locate
from fuzzattn.platform.versions import versions
from fuzzattn.triton_interpreter.backend import ensure_backend


@functools.cache
def default_device() -> str:
    """Asked several times a judged case; torch.cuda.is_available() asks the driver each time
    (~20 us on a machine without CUDA), and the answer does not change within a process."""
    return "cuda" if torch.cuda.is_available() else "cpu"


_ORDER = {check: i for i, check in enumerate(CHECKS)}     # failures are listed in CHECKS' order


@dataclasses.dataclass
class JudgedCase:
    """Every verdict of one implementation on one case, and what a counterexample file needs."""
    impl: str
    case: AttentionCase
    verdicts: list[Verdict]
    skipped: str | None = None          # cannot be judged here (why); neither pass nor fail
    refused: str | None = None          # the implementation refused it with a declared error
    forward_only: str | None = None     # why its gradients went unjudged (a known defect's summary)
    cli_name: str = ""                  # how --impl finds the implementation again
    inputs_sha256: str | None = None    # of the materialised inputs; set when it failed or pinned
    versions: dict | None = None        # torch, triton, hypothesis, fuzzattn; set when it failed

    @property
    def failures(self) -> list[Verdict]:
        return sorted((v for v in self.verdicts if not v.passed), key=lambda v: _ORDER[v.check])

    @property
    def passed(self) -> bool:
        return self.skipped is None and self.refused is None and not self.failures

    @property
    def first_failure(self) -> Verdict | None:
        fails = self.failures
        return fails[0] if fails else None

    def describe(self, *, case: bool = True) -> str:
        """The report; `case=False` leaves out the case's lines (a message that names it already)."""
        if self.skipped:
            return f"[skip] {self.impl}: {self.skipped}\n  case: {self.case}"
        if self.refused:
            return f"[refused] {self.impl}: {self.refused}\n  case: {self.case}"
        if self.passed:
            return f"[ok] {self.impl} {self.case}"
        # One headline per failed check, then the case once, and each distinct map of bad rows
        # once: a wrong row usually fails out, lse and out_rms together.
        fails = self.failures
        lines = [v.headline() for v in fails] + ([f"  case: {self.case}", f"  repr: {self.case!r}"]
                                                 if case else [])
        maps: dict[str, list[str]] = {}
        for v in fails:
            if v.heatmap:
                maps.setdefault(v.heatmap, []).append(v.check)
        for rows, checks in maps.items():
            which = f" ({', '.join(checks)})" if len(maps) > 1 else ""
            lines.append(f"  bad query rows (x) per batch/head{which}:")
            lines.extend("    " + line for line in rows.splitlines())
        return "\n".join(lines)


def skip_reason(impl: Implementation, case: AttentionCase) -> str | None:
    """Why this implementation cannot be judged on this case here, or None."""
    why = impl.caps.why_not(case)
    if why is not None:
        return f"{impl.name} does not declare {why}"
    if impl.backend == "triton" and case.dtype == "bfloat16":
        from fuzzattn.triton_interpreter.backend import bf16_dot_status
        ok, reason = bf16_dot_status()
        if not ok:
            return reason
    return None


def judge(impl: Implementation, case: AttentionCase, device=None, *,
          expected_sha256: str | None = None, gradients: bool = True,
          margins: bool = False) -> JudgedCase:
    """Every check of `impl` on `case`; skipped (with the reason) when it cannot apply here.

    With `expected_sha256` (a counterexample file's pin) the inputs are checked against it right
    after they are materialised, and nothing runs on inputs that drifted. An implementation
    declaring `backward` also gets the gradient checks (fuzzattn/gradients/gradient_verdicts.py) once every forward
    check passed, unless `gradients=False` (a forward-only test keeping its budget).

    `margins=True`: every numeric verdict judged on the whole rule, its `allowed` the whole
    allowance, for reports of how far a kernel is from each bound (`fuzzattn explain`); by
    default a pass within the noise alone reports that, and the same-precision references are
    computed on the host only when a check needs them (tolerance.py's tiers). The same verdicts
    either way.

    On a GPU shared through MPS a device fault raises shared_gpu.SharedDeviceFault instead of
    becoming a verdict: it may be another process's (fuzzattn/platform/shared_gpu.py)."""
    if "triton" in sys.modules:
        # `import fuzzattn` only selects the interpreter; its bf16 repairs come with
        # ensure_backend, which the CLI and the pytest plugin run at start-up. A script judging
        # its own bf16 Triton kernel without them saw a correct kernel 8e8 off.
        ensure_backend()
    try:
        judged = _judge(impl, case, device, expected_sha256=expected_sha256, gradients=gradients,
                        margins=margins)
    except Exception as exc:
        if shared_gpu.guarding:
            shared_gpu.check_error(exc, case)
        # A fault met outside the kernel's call and read-back (the oracle's first launch in the
        # context the kernel just poisoned) is still this case's: a watched process ends with
        # it recorded instead of losing it with the run.
        execute.end_on_device_fault(impl, case, "judging", execute.one_line(exc),
                                    device or default_device())
        raise
    if shared_gpu.guarding:
        shared_gpu.check_judged(judged)
    return judged


def _judge(impl: Implementation, case: AttentionCase, device, *, expected_sha256: str | None,
           gradients: bool, margins: bool) -> JudgedCase:
    device = device or default_device()
    judged = JudgedCase(impl.name, case, [], cli_name=impl.cli_name)
    reason = skip_reason(impl, case)
    if reason is not None:
        judged.skipped = reason
        return judged
    check_budget(case)
    # Materialised once; every run of this judgement gets its own copy of these bits.
    pristine = materialize(case, device)
    if expected_sha256 is not None:
        judged.inputs_sha256 = inputs_sha256(pristine)
        if judged.inputs_sha256 != expected_sha256:
            judged.verdicts.append(Verdict(
                impl=impl.name, case=case, check="inputs_drifted", passed=False,
                detail=f"the case now materialises sha256 {judged.inputs_sha256[:16]}..., the "
                       f"file pins {expected_sha256[:16]}...; not running on different inputs"))
            return judged
    # Where the references compute, and where the checks do (placement.py): the runs deliver
    # their outputs there, and the references are read back there.
    references, here = judge_device(case, device), check_device(case, device)
    first = runs.launch(impl, case, device, adversarial=True, inputs=pristine.copy(),
                        pristine=pristine, here=here)
    if first.call.declared_refusal:
        judged.refused = first.call.summary
        return judged
    if first.call.autotuner_skips and pruning.prunes(impl, case):
        judged.refused, finding = pruning.judge_pruned(
            impl, case, first.call.autotuner_skips,
            lambda other: execute.call(impl, *pristine.copy().tensors(), other))
        if finding is None:
            return judged
        first.failure = Verdict(impl=impl.name, case=case, check=pruning.NO_CONFIGURATION,
                                passed=False, detail=finding)
    second, computed = None, None
    if first.pending is not None and _runs_together(references, device):
        second = runs.launch(impl, case, device, adversarial=False, inputs=pristine.copy(),
                             pristine=pristine, here=here, side_effects=False)
        # Inputs born on the device (a counter case: no host copy yet) come to the host
        # references with the runs' outputs, in the same transfer: the one wait such a case makes.
        host_copy = [pristine.packed] if born_on_device(case, device) and pristine.host is None \
            else []
        back = runs.deliver(impl, case, [first, second], also=host_copy)
        if host_copy and back is not None:
            pristine.keep_host_copy(back[0])
    elif first.pending is not None and not same_device(references, here):
        second, computed = _read_back_with_references(impl, case, device, first, pristine,
                                                      references, here)
    else:
        runs.deliver(impl, case, [first])
    judged.verdicts, computed = _judge_runs(impl, case, device, first, pristine, here, second,
                                            references=references, computed=computed,
                                            margins=margins)
    if gradients and impl.caps.backward and all(v.passed for v in judged.verdicts):
        # The forward's outputs as read back (the same bits, already where the explicit
        # backward's inputs are built: no second read from the device).
        forward = first.delivered[1:] if first.delivered is not None else (first.out, first.lse)
        judged.verdicts += judge_gradients(impl, case, device, forward=forward, judge_on=here,
                                           pristine=pristine, references_on=references,
                                           forward_references=_reusable(computed, references),
                                           margins=margins)
    if not judged.passed:
        judged.inputs_sha256 = judged.inputs_sha256 or inputs_sha256(pristine)
        judged.versions = versions()
    return judged


def _reusable(computed: list[Reference] | None, references: torch.device) -> list | None:
    """The forward's references (oracle, same-precision) for the gradient references to build
    on instead of computing them again from the same pristine inputs (fuzzattn/gradients/reference_gradients.py),
    when they are still where those compute and already read (a float score magnitude, as the
    gradient oracle makes it there); else None. So on the host, and for cases judged wholly on
    the device they are not: there the forward's magnitude is still unread."""
    if computed is None:
        return None
    ref = computed[0]
    if not same_device(ref.out.device, references) or not isinstance(ref.score_magnitude, float):
        return None
    return computed


def _runs_together(references: torch.device, device) -> bool:
    """Whether the second run follows the first at once, both read back in one transfer (one
    wait for a time-sliced GPU instead of two: fuzzattn/run/runs.py). So when the references compute
    on the host while the implementation runs on an accelerator: no reference then touches the
    device, so nothing a reference leaves in device memory can lie between the runs anyway.
    Otherwise the second run comes after the references, on the device they used. (The first
    run's flags are computed before the second run starts, in stream order; a second run that
    writes out of bounds into the first run's still-unread results can change which check
    fails, not turn a failure into a pass.)"""
    return not same_device(references, device)


def _references(impl: Implementation, case: AttentionCase, pristine: Inputs,
                references: torch.device, deferred: bool, on_demand: bool = False) -> list:
    """The float64 oracle and the same-precision reference of `case`, computed on `references`.
    They only read their inputs, and no implementation run ever sees `pristine`. `deferred`:
    the oracle's score magnitude left unread (they are read back elsewhere). `on_demand`: the
    same-precision reference as a function computing it once, when first asked (the checks ask
    only when an error is above its noise alone: tolerance.py's tiers)."""
    originals = pristine.on(references).tensors()
    seen = visibility(case, originals[0].device)        # one mask for both

    def same_precision() -> Reference:
        return same_precision_reference(*originals, case, impl.caps.fp32_matmul,
                                        magnitudes=False, seen=seen)

    truth = oracle(*originals, case, deferred=deferred, seen=seen)
    return [truth, functools.cache(same_precision) if on_demand else same_precision()]


def _read_back_with_references(impl: Implementation, case: AttentionCase, device,
                               first: runs.Run, pristine: Inputs, references: torch.device,
                               here: torch.device) -> tuple[runs.Run | None, list | None]:
    """Half and half (placement.py: references on the accelerator, checks on the host): the
    references compute right after the first run, the second run follows them on the device,
    as the judgement's order asks, and the first run's flags and outputs, the second's outputs
    and the references all come back in one transfer: one wait for a time-sliced GPU where
    there were three. Returns (second run, references on `here`); (None, None) when the first
    run's read-back failed (its crash), or when the device refused more work after it faulted."""
    try:
        with judging():
            computed = _references(impl, case, pristine, references, deferred=True)
        second = runs.launch(impl, case, device, adversarial=False, inputs=pristine.copy(),
                             pristine=pristine, here=here, side_effects=False)
    except Exception:
        # A fault of the first run's kernels makes every later launch in the context fail: its
        # read-back names it as the first run's crash. Anything else is the harness's own error.
        runs.deliver(impl, case, [first])
        if first.failure is None:
            raise
        return None, None
    back = runs.deliver(impl, case, [first, second], also=tensors_in(computed))
    return second, None if back is None else rebuilt(computed, back)


def _judge_runs(impl: Implementation, case: AttentionCase, device, first: runs.Run,
                pristine: Inputs, here: torch.device,
                second: runs.Run | None = None, references=None,
                computed: list | None = None,
                margins: bool = False) -> tuple[list[Verdict], list | None]:
    """The verdicts of the first run, and of the second (`second` when it already ran, else run
    here, after the references), with the references they were judged against (None when the
    first run failed before any). The references compute on `references` (default: `here`) and
    are read back to `here`, where every check computes; `computed`: already there (read back
    with the runs, `_read_back_with_references`). Judged on the host throughout, the
    same-precision reference is computed only if a check asks for it (`_references`); where a
    device is involved it is computed with the oracle and read back with it, so that asking
    for it later is no second wait."""
    if first.failure is not None:
        return [first.failure], None
    verdicts = list(first.side_effects)

    # The references are read back in one copy (their score magnitude with them) to `here`,
    # where every comparison with them computes (placement.py).
    references = here if references is None else references
    if computed is None:
        away = not same_device(references, here)
        with judging():
            # The oracle's score magnitude is left unread off the host: read back with the
            # references (away), or with the value checks' other scalars (value_verdicts).
            computed = _references(impl, case, pristine, references,
                                   deferred=away or here.type != "cpu",
                                   on_demand=here.type == "cpu" and not away and not margins)
            if away:
                computed = moved_together(computed, here)
    ref, spr = computed
    first = run_on(first, here)

    with judging():
        values, nonfinite = value_verdicts(impl, case, first, ref, spr, margins=margins)
    if nonfinite is not None and bool(nonfinite.any()):
        check, detail = attribute_nonfinite(impl, case, device, ref)
        verdicts.append(Verdict(impl=impl.name, case=case, check=check, passed=False,
                                where=locate(nonfinite), heatmap=heatmap(nonfinite), detail=detail))
    verdicts += values

    if second is None:
        second = runs.run(impl, case, device, adversarial=False, inputs=pristine.copy(),
                          pristine=pristine, here=here, side_effects=False)
    if second.failure is not None or not second.call.answered:
        failure = second.failure or Verdict(impl=impl.name, case=case, check="crash", passed=False,
                                            detail=second.call.summary)
        verdicts.append(dataclasses.replace(failure, detail="second run: " + failure.detail))
        return verdicts, computed
    second_here = run_on(second, here)
    with judging():
        same_out, same_lse = same_bits([(first.out, second_here.out),
                                        (first.lse, second_here.lse)])
        if all(v.passed for v in verdicts) and not (same_out and same_lse):
            # The rerun is judged on its own only when the first run passed, so one bug is one
            # verdict, and only when its bits differ from the first run's (the same bits would
            # get the same verdicts).
            rerun, _ = value_verdicts(impl, case, second_here, ref, spr, check_out="rerun",
                                       check_lse="rerun", check_stat="rerun",
                                       find_nonfinite=False, margins=margins)
            verdicts += [v for v in rerun if v.check == "rerun"]
    if impl.caps.deterministic:
        differs = [n for n, same in (("out", same_out), ("lse", same_lse)) if not same]
        verdicts.append(Verdict(impl=impl.name, case=case, check="nondeterministic",
                                passed=not differs,
                                detail=f"{', '.join(differs)} differ bitwise between two runs" if differs else ""))
    return verdicts, computed


def refusal_not_applicable(impl: Implementation) -> str | None:
    """Why the refusal property does not apply to `impl`, or None. A plain callable declared
    nothing: its capabilities are the contract's base, assumed for it, so answering outside them
    (say causal="bottom_right" treated as a truthy flag) breaks no statement it made. fuzz, gate
    and the pytest plugin never draw outside the declaration, so they judge it the same way."""
    if not impl.declares:
        return (f"{impl.name} is a plain callable: it declared no capabilities, so there is "
                "nothing it must refuse (wrap it in an Implementation to declare them)")
    return None


def check_refusal(impl: Implementation, case: AttentionCase, device=None) -> Verdict:
    """An input outside the declaration must raise with a message, not return an answer."""
    not_applicable = refusal_not_applicable(impl)
    if not_applicable is not None:
        raise ValueError(not_applicable)
    why = impl.caps.why_not(case)
    if why is None:
        raise ValueError(f"{case} is inside {impl.name}'s declaration: nothing to refuse")
    inputs = materialize(case, device or default_device())
    verdict = dict(impl=impl.name, case=case, check="refusal")
    call = execute.call(impl, *inputs.tensors(), case)
    if call.status == execute.CONTRACT:
        return Verdict(passed=False, detail=f"answered {why} in the wrong shape: {call.summary}",
                       **verdict)
    if not call.answered:
        message = str(call.error).strip()
        return Verdict(passed=bool(message), detail=f"refused {why}: {call.summary}"
                       if message else f"refused {why} with an empty {type(call.error).__name__}",
                       **verdict)
    return Verdict(passed=False, detail=f"answered {why}, which it does not declare, "
                                        "instead of refusing it", **verdict)
