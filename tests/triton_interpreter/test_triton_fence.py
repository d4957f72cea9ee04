"""fuzzattn/triton_interpreter/fence.py: Triton internals are patched only on a tested Triton.

The version is faked in a fresh process (`triton.__version__`, what the fence reads, set before
fuzzattn is imported), and every attribute of Triton's interpreter and language modules and of
their classes is compared by identity before and after `ensure_backend()`.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fuzzattn.triton_interpreter import backend, fence

ROOT = Path(__file__).resolve().parents[2]


def interpreter_runs(version: str | None = None):
    """Skip a test that runs Triton's interpreter where the installed numpy breaks it (a GPU
    host's environment may hold numpy >= 2.3; the CPU install pins it below)."""
    problem = backend.numpy_incompatibility(version)
    return pytest.mark.skipif(problem is not None, reason=f"the interpreter cannot run here: {problem}")

# Everything fuzzattn replaces inside Triton (module, class or object, then attribute).
PATCHED = {
    "triton.runtime.interpreter.InterpreterBuilder.create_dot",         # bf16 dot repair
    "triton.runtime.interpreter.InterpreterBuilder.cast_impl",          # bf16 cast repair
    "interpreter_builder.options",                                      # overflow sanitizer off
    "triton.runtime.interpreter._patch_lang",
    "triton.runtime.interpreter.GridExecutor.__call__",
    "triton.runtime.interpreter._get_np_dtype",
    "triton.runtime.interpreter._patch_attr",
    "triton.language.core.tuple_type.__init__",
    "triton.language.core.tuple_type.name",
    "triton.language.core.block_type.__init__",
    "triton.language.core.block_type.name",
    "triton.language.core.tensor.__init__",
    "triton.language.core.tensor.shape",
    "triton.language.core.tensor.numel",
    "triton.language.core._unwrap_if_constexpr",
    "triton.language.semantic.TritonSemantic.broadcast_impl_value",
    "triton.language.semantic.TritonSemantic.binary_op_type_checking_impl",
    "triton.language.semantic.TritonSemantic.expand_dims",
    "triton.language.semantic.TritonSemantic.to_tensor",
}

_PROBE = r"""
import json, sys
import triton
if sys.argv[1] != "-":
    triton.__version__ = sys.argv[1]
import triton.language.core as core
import triton.language.semantic as semantic
import triton.runtime.interpreter as interp

def snapshot():
    owners = {m.__name__: m for m in (interp, core, semantic)}
    for module in (interp, core, semantic):
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__.startswith("triton."):
                owners[f"{value.__module__}.{value.__qualname__}"] = value
    owners["interpreter_builder"] = interp.interpreter_builder
    owners["interpreter_semantic"] = interp.interpreter_semantic
    return {f"{label}.{name}": value for label, owner in owners.items()
            for name, value in list(vars(owner).items())}

before = snapshot()
import fuzzattn
from fuzzattn.triton_interpreter import backend
backend.ensure_backend()
backend.ensure_backend()
after = snapshot()
missing = object()
changed = sorted(k for k in before.keys() | after.keys() if before.get(k, missing) is not after.get(k, missing))
result = {"changed": changed, "status": backend.bf16_dot_status()}
if "judge" in sys.argv[2:]:
    from fuzzattn import AttentionCase, judge
    from fuzzattn.judgement.judge import skip_reason
    from fuzzattn.kernels.triton_fa2 import IMPL
    bf16, fp32 = (AttentionCase(1, 1, 1, 5, 7, 16, dtype=d) for d in ("bfloat16", "float32"))
    done = judge(IMPL, fp32, device="cpu", gradients=False)
    result.update(bf16_skip=skip_reason(IMPL, bf16), fp32_skip=skip_reason(IMPL, fp32),
                  bf16_judged=judge(IMPL, bf16, device="cpu").skipped,
                  fp32_passed=done.passed, fp32_failures=[v.check for v in done.failures])
print("RESULT " + json.dumps(result))
"""


def _probe(version: str, *extra: str) -> tuple[dict, list[str]]:
    """Run _PROBE interpreted with triton.__version__ faked as `version` ('-': the real one):
    (its result, its stderr lines that start with 'fuzzattn:')."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("FUZZATTN_INTERPRETER_SPEED", None)
    env.pop("FUZZATTN_SANITIZE_OVERFLOW", None)
    done = subprocess.run([sys.executable, "-c", _PROBE, version, *extra], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), [x for x in done.stderr.splitlines()
                                                 if x.startswith("fuzzattn:")]


def test_the_range_is_declared_once_and_read_on_release_numbers():
    assert fence.described() == ">=3.6,<3.7"
    for inside in ("3.6", "3.6.0", "3.6.0+git1a2b3c", "3.6.12"):
        assert fence.tested(inside), inside
    for outside in ("3.5.9", "3.7", "3.7.0", "3.7.0rc1", "4.0.0", "", "unknown"):
        assert not fence.tested(outside), outside


def test_pyproject_requires_no_triton_below_the_tested_range():
    text = (ROOT / "pyproject.toml").read_text()
    requirement = re.search(r'"triton(>=[\d.]+)[^"]*"', text)
    assert requirement, "pyproject.toml names no triton lower bound"
    lower = next(b for b in fence.TESTED if b.startswith(">="))
    assert requirement.group(1) == lower


@pytest.mark.skipif(not fence.tested(), reason="the installed triton is outside the tested range")
@interpreter_runs()
def test_inside_the_range_every_patch_is_applied_and_nothing_else():
    result, said = _probe("3.6.2+git0abc")
    assert set(result["changed"]) == PATCHED
    ok, reason = result["status"]
    assert ok and "repaired" in reason, reason
    assert said == []


@pytest.mark.parametrize("version", [pytest.param("3.7.0", marks=interpreter_runs("3.7.0")),
                                     pytest.param("3.5.1", marks=interpreter_runs("3.5.1"))])
def test_outside_the_range_nothing_is_patched_and_one_line_says_so(version):
    result, said = _probe(version)
    assert result["changed"] == []
    assert len(said) == 1, said
    assert f"triton {version} " in said[0] and "triton>=3.6,<3.7" in said[0]
    ok, reason = result["status"]
    assert not ok
    assert reason.startswith(f"triton {version} is outside the tested range triton>=3.6,<3.7")
    assert "bf16" in reason and "\n" not in reason


@interpreter_runs()         # the installed interpreter runs its fp32 case, whatever the fake says
def test_outside_the_range_bf16_triton_cases_are_refused_and_fp32_runs_unpatched():
    """The judge skips a bf16 triton_fa2 case with the version's reason (the repairs are absent),
    and still judges an fp32 case, which passes on the unpatched interpreter."""
    result, said = _probe("3.7.0", "judge")
    assert result["changed"] == [] and len(said) == 1
    reason = result["status"][1]
    assert "triton 3.7.0" in reason
    assert result["bf16_skip"] == reason == result["bf16_judged"]
    assert result["fp32_skip"] is None
    assert result["fp32_passed"], result["fp32_failures"]


_SELF_CHECK = r"""
import fuzzattn
from fuzzattn.triton_interpreter import backend
from triton.runtime.interpreter import InterpreterBuilder as B
install_dot = backend._install_bf16_dot_repair
backend._install_bf16_dot_repair = lambda: False          # the dot left as triton ships it
print("DOT", backend.bf16_dot_status())
backend._install_bf16_dot_repair = install_dot
install_dot()
B.cast_impl = B.cast_impl.__wrapped__                     # the cast as triton ships it
backend._install_bf16_cast_repair = lambda: False
backend._bf16_status = None
print("CAST", backend.bf16_dot_status())
"""


@pytest.mark.skipif(not fence.tested(), reason="the installed triton is outside the tested range")
@interpreter_runs()
def test_inside_the_range_the_self_check_still_catches_a_missing_repair():
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", _SELF_CHECK], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line[:4] in ("DOT ", "CAST"))
    assert lines["DOT"].startswith("(False,") and "multiplies raw bf16 bits" in lines["DOT"]
    assert lines["CAST"].startswith("(False,") and "truncates fp32 -> bf16" in lines["CAST"]
