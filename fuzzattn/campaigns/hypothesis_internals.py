"""Every Hypothesis internal fuzzattn relies on, in one module, each fenced by version.

**A campaign's test** (campaign.py). A campaign runs one @given test in rounds, each with its own
settings and seed, and keeps its failures in the example database under the implementation's
name, not the test function's source (which changes with every edit of the harness). Hypothesis
has no public way to change a decorated test's settings or seed after decoration, or to name its
database key: it keeps them in three attributes of the wrapped test, unchanged through 6.x.
Outside CAMPAIGN_TESTED, `campaign_internals_supported` says no and a campaign refuses with one
line naming the version, rather than run with settings it did not mean.

**The final run, and the profile loaded.** A campaign writes a regression file only on the run
Hypothesis makes last, of the minimal failing example: its build context's `is_final`, an
attribute with no public reader (outside CAMPAIGN_TESTED every failing run counts as final: more
files, none lost). The command line and the pytest plugin put back the settings profile they
found: `settings.get_current_profile_name()` where Hypothesis has it, else (inside
CAMPAIGN_TESTED) the class attribute behind it.

**The explain phase.** After shrinking a failure, Hypothesis traces the test again and reports the lines "always and
only run by failing test cases". In a test that calls `check_case`, the lines that describe,
save and raise a failure are such lines in every failure: reported, they point the reader at
the harness instead of at the kernel. Hypothesis leaves its own files out of that trace with
one predicate, `hypothesis.internal.scrutineer.should_trace_file(filename)`; there is no public
way to name another library's files, so `install` wraps that predicate to leave fuzzattn's
package out too (which also spares the trace the judge's many lines).

It is an internal function, so the wrap applies only inside TESTED and only when the function
is there with one parameter; elsewhere Hypothesis runs as shipped, and a failure's explanation
may list fuzzattn's lines: noisier, never wrong.
"""
from __future__ import annotations

import functools
import inspect
import os
from pathlib import Path

from fuzzattn.triton_interpreter.fence import release

# Read against hypothesis 6.170's scrutineer; the predicate has kept its shape within 6.x since.
TESTED = ((6, 170), (7,))
# The three attributes of a @given test a campaign sets: names unchanged from 6.100 through 6.x.
CAMPAIGN_TESTED = ((6, 100), (7,))
_PACKAGE = str(Path(__file__).resolve().parent.parent) + os.sep
_MARK = "_fuzzattn_untraced"


@functools.cache          # asked on every drawn case
def applies(version: str, tested=TESTED) -> bool:
    """Whether a Hypothesis of this version is inside `tested` (its lower bound included)."""
    have = release(version)
    low, high = tested
    return bool(have) and low <= have[:len(low)] and have[:len(high)] < high


def campaign_internals_supported() -> str | None:
    """None, or why this Hypothesis cannot run a campaign (one line naming its version)."""
    import hypothesis
    if applies(hypothesis.__version__, CAMPAIGN_TESTED):
        return None
    low, high = (".".join(map(str, v)) for v in CAMPAIGN_TESTED)
    return (f"hypothesis {hypothesis.__version__} is outside the range fuzzattn's campaigns are "
            f"tested with (>= {low}, < {high}): install one inside it")


def settings_of(test):
    """The settings a @given test runs with."""
    return test._hypothesis_internal_use_settings


def use_settings(test, value) -> None:
    """Run a @given test with other settings from its next call on."""
    test._hypothesis_internal_use_settings = value


def use_seed(test, seed: int) -> None:
    """Draw a @given test's next run from this seed (what @seed sets at decoration)."""
    test._hypothesis_internal_use_seed = seed


def use_database_key(test, key: bytes) -> None:
    """Keep a @given test's failures in the example database under `key`."""
    test._hypothesis_internal_database_key = key


def final_run() -> bool:
    """Whether this call of a @given test's body is Hypothesis's last one, on the minimal failing
    example it reports (False outside a test)."""
    import hypothesis
    if not hypothesis.currently_in_test_context():
        return False
    if not applies(hypothesis.__version__, CAMPAIGN_TESTED):
        return True
    from hypothesis.control import current_build_context
    return current_build_context().is_final


def profile_name() -> str | None:
    """The name of the Hypothesis settings profile loaded now (None where it cannot be read)."""
    import hypothesis
    from hypothesis import settings
    getter = getattr(settings, "get_current_profile_name", None)
    if getter is not None:
        return getter()
    if applies(hypothesis.__version__, CAMPAIGN_TESTED):
        return getattr(settings, "_current_profile", None)
    return None


def ours(filename: str) -> bool:
    """A file of the fuzzattn package itself (not the kernels or strategies it judges with)."""
    try:
        return str(Path(filename).resolve()).startswith(_PACKAGE)
    except (OSError, ValueError):
        return False


def install() -> bool:
    """Wrap Hypothesis's trace predicate (idempotent); returns whether the wrap is in place."""
    import hypothesis
    try:
        from hypothesis.internal import scrutineer
    except ImportError:
        return False
    original = getattr(scrutineer, "should_trace_file", None)
    if getattr(original, _MARK, False):
        return True
    if not applies(hypothesis.__version__) or not callable(original) or not _one_parameter(original):
        return False

    @functools.cache
    def should_trace_file(filename: str) -> bool:
        return original(filename) and not ours(filename)

    setattr(should_trace_file, _MARK, True)
    scrutineer.should_trace_file = should_trace_file
    return True


def _one_parameter(function) -> bool:
    try:
        return len(inspect.signature(function).parameters) == 1
    except (TypeError, ValueError):
        return False
