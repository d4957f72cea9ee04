"""The Triton versions fuzzattn's patches of Triton internals were tested on, in one place.

backend.py (the bf16 repairs), speed.py and semantic.py replace private parts of Triton's
interpreter and language frontend, which change between releases without notice. They apply
only to a Triton inside TESTED. Outside it Triton runs as shipped: slower, and with its wrong
bf16 arithmetic unrepaired, so bf16 Triton cases under the interpreter are refused
(backend.bf16_dot_status), and one line on stderr says why.
"""
from __future__ import annotations

import operator
import re
import sys

# Every patch was compared against triton 3.6.0's own functions (tests/triton_interpreter/test_interpreter_speed.py).
TESTED = (">=3.6", "<3.7")
MARK = "_fuzzattn_speed"     # set on each speed edit: makes installing idempotent, lets tests find them

_COMPARE = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq}
_said = False                 # the stderr line is printed once a process


def release(version: str) -> tuple[int, ...]:
    """The leading dotted numbers: (3, 6, 0) of '3.6.0', '3.6.0+git1a2b' or '3.7.0rc1'."""
    found = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in found.group().split(".")) if found else ()


def _bounds() -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for bound in TESTED:
        op = re.match(r"[<>=]+", bound).group()
        out.append((op, release(bound[len(op):])))
    return out


def installed() -> str:
    """The version of the triton that is imported (triton.__version__)."""
    import triton
    return str(getattr(triton, "__version__", "unknown"))


def described() -> str:
    """TESTED as a requirement string: '>=3.6,<3.7'."""
    return ",".join(TESTED)


def tested(version: str | None = None) -> bool:
    """Whether `version` (default: the installed triton's) is inside TESTED. Bounds compare on
    the release numbers, zero-padded, so '3.7.0rc1' is already outside '<3.7'; a version with no
    numbers is outside."""
    have = release(installed() if version is None else version)
    if not have:
        return False
    for op, bound in _bounds():
        width = max(len(have), len(bound))
        if not _COMPARE[op](have + (0,) * (width - len(have)), bound + (0,) * (width - len(bound))):
            return False
    return True


def untested(consequence: str) -> str:
    """One line: the installed triton is outside TESTED, and `consequence`."""
    return f"triton {installed()} is outside the tested range triton{described()}: {consequence}"


def say_untested_once() -> None:
    """Print, once a process, that Triton's interpreter runs unpatched here."""
    global _said
    if not _said:
        _said = True
        print("fuzzattn: " + untested("its interpreter runs unpatched (no speed-ups; bf16 Triton "
                                      "cases are refused, their repairs are off)"), file=sys.stderr)
