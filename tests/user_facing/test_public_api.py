"""What a kernel engineer touches: the public API in their own test, and a plugin that stays out
of test runs that did not ask for it."""
from __future__ import annotations

import textwrap

import pytest

import fuzzattn
from fuzzattn import AttentionCase, judge

# The README's "your own kernel" example, verbatim in spirit: a user's Hypothesis test.
USER_TEST = textwrap.dedent('''
    import torch
    from hypothesis import given, settings
    from fuzzattn import Capabilities, Implementation, attention_cases, check_case, refuse

    def my_attention(q, k, v, *, causal, scale):
        if q.dtype != torch.float32:
            refuse("dtype", q.dtype, "float32")
        s = (q @ k.transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)

    MINE = Implementation("mine", my_attention, Capabilities(dtypes={"float32"}, head_dims={16, 32}))

    @settings(max_examples=25, derandomize=True, database=None, deadline=None)
    @given(attention_cases(MINE.caps))
    def test_mine(case):
        check_case(MINE, case, save_to_file=False)
''')


def test_the_public_api_is_what_a_user_test_needs():
    for name in ("attention_cases", "check_case", "Capabilities", "Implementation",
                 "AttentionCase", "refuse"):
        assert name in fuzzattn.__all__ and hasattr(fuzzattn, name)


def test_a_user_written_test_passes_on_a_correct_kernel_and_fails_on_a_bug(pytester):
    pytester.makepyfile(test_user=USER_TEST)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    pytester.makepyfile(test_user=USER_TEST.replace("* scale", "* scale * 1.01"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]FAIL[]] mine *error=*allowed=*"])


UNRELATED = textwrap.dedent('''
    import os
    from hypothesis import given, settings, strategies as st

    settings.register_profile("theirs", max_examples=7)
    settings.load_profile("theirs")
    SEEN = []

    @given(st.integers())
    def test_their_own_settings_hold(x):
        SEEN.append(x)

    def test_after():
        assert len(SEEN) == 7                                  # their profile, not fuzzattn's
        assert settings().max_examples == 7
        assert "FUZZATTN_PROFILE" not in os.environ
        assert "TRITON_INTERPRET" not in os.environ
''')


def test_an_unrelated_project_is_untouched_by_an_installed_fuzzattn(pytester, monkeypatch):
    for name in ("FUZZATTN_PROFILE", "TRITON_INTERPRET", "CI"):
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(test_theirs=UNRELATED)
    (pytester.path / "regressions").mkdir()
    (pytester.path / "regressions" / "x.json").write_text("{not a regression file")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=2)                  # regressions/x.json was not collected
    assert "fuzzattn:" not in result.stdout.str()     # no header line either


def test_an_opted_in_run_says_what_it_set_up(pytester):
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "fuzzattn.pytest_plugin", "-p", "no:cacheprovider",
                                           "--fuzzattn-profile", "dev")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["fuzzattn: profile=dev * hypothesis_seed=* device=*",
                                 "fuzzattn: triton *"])


def test_the_plugin_runs_without_pytest_xdist(pytester):
    """pytest-xdist is the suite's test extra, not a dependency: its hook is optional here."""
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "fuzzattn.pytest_plugin",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_a_bad_profile_name_is_one_line(pytester):
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "fuzzattn.pytest_plugin", "--fuzzattn-profile", "nope")
    assert result.ret == 4                            # pytest's usage error
    errors = [line for line in result.stderr.str().splitlines() if "nope" in line]
    assert errors and all("INTERNALERROR" not in line for line in result.stderr.str().splitlines())


def test_shards_split_one_campaign_over_xdist_workers(pytester):
    from pathlib import Path
    suite = Path(__file__).resolve().parents[1] / "kernels" / "test_differential.py"
    result = pytester.runpytest_subprocess("--co", "-q", "-p", "no:cacheprovider", str(suite),
                                           "--fuzzattn-shards", "3", "-k", "sdpa-float32")
    names = [line for line in result.stdout.lines if "::test_matches_oracle" in line]
    assert sorted(n.split("::")[1] for n in names) == [
        f"test_matches_oracle_shard{i}[sdpa-float32]" for i in range(3)]


def test_the_summary_counts_judged_cases_across_workers(pytester):
    from pathlib import Path
    suite = Path(__file__).resolve().parents[1] / "kernels" / "test_differential.py"
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", str(suite), "-n", "2",
                                           "--fuzzattn-shards", "2", "--fuzzattn-max-examples", "10",
                                           "--fuzzattn-profile", "dev", "-k", "sdpa-float32")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["fuzzattn: 10 cases judged in * s (* cases/s)"])


LOSES_CUDA = textwrap.dedent('''
    import fuzzattn.pytest_plugin as plugin

    def test_faults_in_process():
        # what a device fault leaves behind, simulated: every later CUDA call would fail
        plugin.cuda_context_lost = lambda: "AcceleratorError: CUDA error: misaligned address"

    def test_runs_in_a_fresh_worker():
        assert plugin.cuda_context_lost() is None
''')


def test_a_lost_cuda_context_costs_one_test_not_the_worker(pytester):
    """The test after which the CUDA context is lost fails at teardown, saying so; its xdist
    worker then exits and a fresh one runs the next test (on the H200 one fault had failed 110
    later tests). Without xdist the run stops there, with the same line."""
    pytester.makepyfile(test_lost=LOSES_CUDA)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "fuzzattn.pytest_plugin",
                                           "-n", "1")
    result.stdout.fnmatch_lines(["*replacing crashed worker*",
                                 "*test_faults_in_process lost this process's CUDA context "
                                 "(AcceleratorError: CUDA error: misaligned address)*"])
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] == 2 and outcomes.get("errors", 0) + outcomes.get("failed", 0) >= 1
    alone = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "fuzzattn.pytest_plugin")
    assert alone.ret == 3
    alone.stdout.fnmatch_lines(["*lost this process's CUDA context*no later test could run*"])
    assert "test_runs_in_a_fresh_worker" not in alone.stdout.str()


PASSED_OVER = textwrap.dedent('''
    import pytest
    import torch
    from hypothesis import given, settings
    from fuzzattn import Capabilities, Implementation, KnownDefect, attention_cases, check_case
    from fuzzattn.judgement.judge import default_device

    def attention(q, k, v, *, causal, scale):
        # Fresh memory: on CUDA, SDPA's flash kernel faults with "misaligned address" on the
        # harness's unaligned storage offsets (kernels/sdpa.py works around it the same way).
        q, k, v = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal),
                                                                scale=scale)

    KNOWN = KnownDefect("causal is broken here", torch.device(default_device()).type,
                        lambda case: case.causal != "none", "example.json")
    MINE = Implementation("mine", attention, Capabilities(
        dtypes={"float32"}, head_dims={16}, returns_lse=False, known_defects=(KNOWN,)))

    @pytest.mark.parametrize("part", [0, 1])
    @settings(max_examples=20, derandomize=True, database=None, deadline=None)
    @given(case=attention_cases(MINE.caps))
    def test_mine(part, case):
        check_case(MINE, case, save_to_file=False)

    FAULTS = KnownDefect("backward faults here", KNOWN.device_type, lambda case: True,
                         "example.json", backward=True, check="device_fault")
    GRADS = Implementation("grads", attention, Capabilities(
        dtypes={"float32"}, head_dims={16}, returns_lse=False, backward=True,
        known_defects=(FAULTS,)))

    @settings(max_examples=5, derandomize=True, database=None, deadline=None)
    @given(case=attention_cases(GRADS.caps))
    def test_grads(case):
        check_case(GRADS, case, save_to_file=False)
''')


def test_the_summary_says_how_many_draws_were_passed_over_across_workers(pytester):
    """Draws without a verdict (refused, or a known defect's) are never passes, and never
    silent: the run's summary counts them per implementation, added up over xdist workers; so
    are cases whose gradients were not judged."""
    pytester.makepyfile(test_known=PASSED_OVER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "fuzzattn.pytest_plugin",
                                           "-n", "2")
    result.assert_outcomes(passed=3)
    line = [x for x in result.stdout.lines if "draws passed over" in x]
    assert len(line) == 1, result.stdout.str()
    assert line[0].startswith("fuzzattn: mine: ")
    assert line[0].endswith("draws passed over: known upstream defect (example.json): "
                            "causal is broken here")
    assert int(line[0].split()[2]) >= 2          # both workers' draws, added up
    # a backward's device fault: its cases are judged, their gradients passed over
    line = [x for x in result.stdout.lines if x.startswith("fuzzattn: grads: ")]
    assert len(line) == 1 and line[0].endswith(
        " cases judged without gradients: known upstream defect (example.json): "
        "backward faults here"), result.stdout.str()
    assert int(line[0].split()[2]) >= 1


# The README's gradients example: a kernel offering its own backward, loaded from its file.
README_GRADIENT_EXAMPLE = '''
import torch
import torch.nn.functional as F
from fuzzattn import Capabilities, Implementation

def my_attention(q, k, v, *, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=scale)

def my_backward(q, k, v, out, lse, dout, *, causal, scale):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=scale)
    return torch.autograd.grad(o, (q, k, v), dout)

MY_KERNEL = Implementation(
    name="my_kernel", fn=my_attention, backward_fn=my_backward,
    caps=Capabilities(returns_lse=False, backward=True, deterministic_backward=True))
'''


def test_the_readme_gradient_example_loads_from_a_file_and_passes(tmp_path):
    from fuzzattn.run.loader import load_implementation
    path = tmp_path / "my_kernel.py"
    path.write_text(README_GRADIENT_EXAMPLE)
    impl = load_implementation(f"{path}:MY_KERNEL")
    judged = judge(impl, AttentionCase(batch=1, heads=1, kv_heads=1, seq_q=3, seq_k=5, head_dim=16,
                                       causal="top_left"))
    assert judged.passed, judged.describe()
    assert "grad_dq" in {v.check for v in judged.verdicts}


def test_a_library_module_first_imported_by_an_in_process_run_stays_loaded(pytester):
    """conftest.py: an in-process pytester run keeps the library modules it imported (torch's
    cannot be imported twice: flex's compile failed in every later test of an xdist worker)."""
    import sys
    candidates = ("torch.utils.show_pickle", "torch.utils.bundled_inputs", "torch.utils.model_dump",
                  "torch.utils.jit.log_extract")
    name = next(n for n in candidates if n not in sys.modules)
    # The standard library's too: a re-imported concurrent.futures.process failed every later
    # ProcessPoolExecutor of the worker (its cached class pickles another module's function).
    stdlib = next(n for n in ("concurrent.futures.process", "mailbox", "tabnanny", "wave")
                  if n not in sys.modules)
    pytester.makepyfile(f"def test_imports():\n    import {name}\n    import {stdlib}\n")
    pytester.makepyfile(mine="VALUE = 1\n")
    pytester.makepyfile(test_mine="def test_mine():\n    import mine\n")
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)
    assert name in sys.modules and stdlib in sys.modules
    assert "mine" not in sys.modules            # the run's own modules are still undone


USER_BF16_TRITON = '''
import torch
import fuzzattn                      # before triton: it selects the interpreter without a GPU
import triton
import triton.language as tl
from fuzzattn import AttentionCase, Capabilities, Implementation, judge


@triton.jit
def _attention(q_ptr, k_ptr, v_ptr, o_ptr, nq, nk, scale, D: tl.constexpr, B: tl.constexpr):
    rows, dims = tl.arange(0, B), tl.arange(0, D)
    tile = rows[:, None] * D + dims[None, :]
    q = tl.load(q_ptr + tile, mask=rows[:, None] < nq, other=0.0)
    k = tl.load(k_ptr + tile, mask=rows[:, None] < nk, other=0.0)
    v = tl.load(v_ptr + tile, mask=rows[:, None] < nk, other=0.0)
    s = tl.where(rows[None, :] < nk, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
    p = tl.exp(s - tl.max(s, 1)[:, None])
    p = p / tl.sum(p, 1)[:, None]
    out = tl.dot(p.to(v.dtype), v)
    tl.store(o_ptr + tile, out.to(o_ptr.dtype.element_ty), mask=rows[:, None] < nq)


def attention(q, k, v, *, causal, scale):
    q, k, v = (t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q)
    _attention[(1,)](q, k, v, out, q.shape[2], k.shape[2], scale, D=16, B=16)
    return out


MINE = Implementation("mine_bf16", attention, Capabilities(
    dtypes={"bfloat16"}, head_dims={16}, causal=(), returns_lse=False))
judged = judge(MINE, AttentionCase(1, 1, 1, 5, 7, 16, dtype="bfloat16"), gradients=False)
print(judged.describe())
assert judged.passed
'''


def test_a_script_judging_its_own_bf16_triton_kernel_gets_the_interpreter_repaired(tmp_path):
    """A plain script (no CLI, no pytest plugin) imports fuzzattn, then triton, and judges its
    own bf16 Triton kernel: the interpreter's bf16 tl.dot multiplies raw bit patterns unless
    fuzzattn's repair is in place, and this correct kernel was judged 8e8 off."""
    import os
    import subprocess
    import sys

    script = tmp_path / "mine.py"
    script.write_text(USER_BF16_TRITON)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("[ok] mine_bf16"), done.stdout


def test_the_hypothesis_internals_campaigns_use_are_fenced_by_version(monkeypatch):
    import hypothesis
    from fuzzattn.campaigns import hypothesis_internals
    from fuzzattn.settings import check_environment
    assert hypothesis_internals.campaign_internals_supported() is None      # the installed one
    assert hypothesis_internals.applies("6.100.0", hypothesis_internals.CAMPAIGN_TESTED)
    assert not hypothesis_internals.applies("7.0.0", hypothesis_internals.CAMPAIGN_TESTED)
    monkeypatch.setattr(hypothesis, "__version__", "7.1.0")
    why = hypothesis_internals.campaign_internals_supported()
    assert why.startswith("hypothesis 7.1.0 is outside") and "< 7" in why
    with pytest.raises(ValueError, match="hypothesis 7.1.0"):
        check_environment()                # the CLI's one-line usage error, before anything runs


def test_the_run_hypothesis_reports_and_the_profile_loaded_are_read_within_the_fence(monkeypatch):
    """The one regression file of a failure is written on the run Hypothesis reports."""
    import hypothesis
    from hypothesis import given, settings, strategies as st
    from fuzzattn.campaigns.hypothesis_internals import final_run, profile_name
    seen = []

    @settings(max_examples=50, database=None, derandomize=True, deadline=None)
    @given(st.integers(0, 100))
    def fails_from_ten(x):
        seen.append((x, final_run()))
        assert x < 10

    with pytest.raises(AssertionError):
        fails_from_ten()
    assert seen[-1] == (10, True) and not any(final for _, final in seen[:-1]), seen
    assert final_run() is False                                      # outside any test
    monkeypatch.setattr(hypothesis, "__version__", "7.1.0")          # unknown: every failing run
    seen.clear()
    with pytest.raises(AssertionError):
        fails_from_ten()
    assert all(final for _, final in seen)
    assert profile_name() == settings.get_current_profile_name()
    # a Hypothesis without the public getter: its class attribute is read only inside the fence
    monkeypatch.setattr(hypothesis, "settings", type("settings", (), {"_current_profile": "theirs"}))
    assert profile_name() is None                                    # 7.1.0
    monkeypatch.setattr(hypothesis, "__version__", "6.100.0")
    assert profile_name() == "theirs"


HEAVY = ("torch", "triton", "numpy", "hypothesis")
# what a command line does first: import the package, build the parser (`fuzzattn --help`)
LIGHT_START = ("import os, sys, fuzzattn; from fuzzattn.cli import build_parser; build_parser(); "
               f"print(os.environ.get('TRITON_INTERPRET'), *[m for m in {HEAVY!r} if m in sys.modules])")


@pytest.mark.parametrize("interpret", ["1", None], ids=["chosen", "unset"])
def test_importing_fuzzattn_and_its_command_line_imports_no_torch(interpret):
    """The public API and the commands import torch, Hypothesis and triton when first used. With
    TRITON_INTERPRET unset the interpreter is still chosen at import, from no GPU in sight."""
    import os
    import subprocess
    import sys
    from fuzzattn.triton_interpreter.backend import GPU_SIGNS
    if interpret is None and any(os.path.exists(sign) for sign in GPU_SIGNS):
        pytest.skip("a GPU is in sight here: torch decides, so `import fuzzattn` imports it")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"TRITON_INTERPRET": interpret} if interpret else {})
    done = subprocess.run([sys.executable, "-c", LIGHT_START], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1"], done.stdout
