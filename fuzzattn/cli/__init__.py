"""The `fuzzattn` command: fuzz implementations, replay regression files, self-test on mutants,
and gate CI. One module per command; `common` holds what they share.

    fuzzattn fuzz --impl sdpa --impl path/to/mine.py:my_attention
    fuzzattn replay regressions/                     # or single regression files
    fuzzattn mutants [--list]
    fuzzattn gate [--mutants] [--changed-since origin/main] [--junit-xml gate.xml] [--markdown gate.md]
    fuzzattn explain regressions/abc123.json --impl sdpa_cudnn   # which factor the failure needs
    fuzzattn triage regressions/ [--prune]           # group files by cause, remove duplicates

Exit status: 0 when everything passed; 1 when something failed (a counterexample, a failing or
unreadable regression file, a surviving mutant); 2 when the command could not run as asked (a
bad argument, an implementation that cannot be loaded, a bad git revision); 3 when a device
fault on a GPU shared through MPS ended the run without a verdict (fuzzattn/platform/shared_gpu.py); 70
when fuzzattn itself failed (an internal error: one line naming the file its traceback was
written to); 130 when interrupted; 141, silently, when stdout's reader went away (`| head`).
Every status-2, 3 or 70 problem is one line on stderr starting with "fuzzattn: error:", never a
traceback; FUZZATTN_DEBUG=1 lets an internal error show its traceback instead.

`main(argv)` runs in-process (the tests call it directly), so it restores the Hypothesis profile
and FUZZATTN_PROFILE it found when it returns. Heavy imports (torch, kernels) happen inside the
commands, so `fuzzattn --help` is instant.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings

from fuzzattn.cli import explain, fuzz, gate, mutants, replay, triage
from fuzzattn.cli.common import CLIError, flattened
from fuzzattn.platform.shared_gpu import SharedDeviceFault

SHARED_DEVICE_FAULT_STATUS = 3
# sysexits' EX_SOFTWARE: fuzzattn's own fault, to tell apart from a finding (1) and a usage error (2)
INTERNAL_ERROR_STATUS = 70

COMMANDS = (fuzz, replay, mutants, gate, explain, triage)


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors become CLIError: one line, our prefix, no usage dump."""

    def error(self, message):
        raise CLIError(message)


def build_parser() -> argparse.ArgumentParser:
    from fuzzattn import __version__
    parser = _Parser(prog="fuzzattn", description="Differential fuzz testing for attention kernels.")
    parser.add_argument("--version", action="version", version=f"fuzzattn {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


@contextlib.contextmanager
def _profile_restored():
    """Put back the Hypothesis profile and FUZZATTN_PROFILE: main() may run inside pytest."""
    from hypothesis import settings
    from fuzzattn.campaigns.hypothesis_internals import profile_name
    name = profile_name()
    env = os.environ.get("FUZZATTN_PROFILE")
    try:
        yield
    finally:
        if name:
            with contextlib.suppress(Exception):
                settings.load_profile(name)
        if env is None:
            os.environ.pop("FUZZATTN_PROFILE", None)
        else:
            os.environ["FUZZATTN_PROFILE"] = env


def _check_environment() -> None:
    """fuzzattn.settings.check_environment, its ValueError a one-line usage error."""
    from fuzzattn import settings
    try:
        settings.check_environment()
    except ValueError as exc:
        raise CLIError(str(exc)) from None


READER_GONE_STATUS = 141      # 128 + SIGPIPE, what a shell reports for a tool whose reader left


def _reader_gone() -> bool:
    """Whether stdout's reader went away (`fuzzattn gate | head`): then the command stops quietly,
    as Unix tools do, and Python's own flush at exit writes nowhere instead of raising again. A
    broken pipe of the command's own (to a worker) leaves stdout writable, and stays an error."""
    import select
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        gone = any(events & select.POLLERR for _, events in poller.poll(0))   # a pipe with no reader
    except (AttributeError, OSError, ValueError):      # no descriptor (a captured stream)
        return False
    if gone:
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    return gone


def internal_error(exc: BaseException, argv=None) -> int:
    """One line on stderr naming the error and the file its traceback went to; the status."""
    import tempfile
    import traceback
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        from fuzzattn import __version__
    except Exception:           # the package itself may be what failed
        __version__ = "unknown"
    argv = sys.argv[1:] if argv is None else argv
    try:
        fd, path = tempfile.mkstemp(prefix="fuzzattn-internal-error-", suffix=".txt")
        with os.fdopen(fd, "w") as file:
            file.write(f"fuzzattn {__version__}, python {sys.version.split()[0]}\n"
                       f"command: fuzzattn {' '.join(map(str, argv))}\n\n{text}")
        where = f"traceback written to {path}"
    except OSError as write_error:
        where = f"its traceback could not be written ({write_error}); FUZZATTN_DEBUG=1 shows it"
    print(f"fuzzattn: error: internal error: {type(exc).__name__}: {flattened(exc)} ({where})",
          file=sys.stderr)
    return INTERNAL_ERROR_STATUS


def guarded(run, argv) -> int:
    """run(argv), an unexpected exception of fuzzattn's own one line and INTERNAL_ERROR_STATUS
    (FUZZATTN_DEBUG=1: the traceback), in the command's process as in its watched child."""
    try:
        return run(argv)
    except Exception as exc:
        if os.environ.get("FUZZATTN_DEBUG"):
            raise
        return internal_error(exc, argv)


def main(argv=None) -> int:
    return guarded(_main, argv)


def _main(argv) -> int:
    from fuzzattn import settings
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except CLIError as exc:
        print(f"fuzzattn: error: {flattened(exc)}", file=sys.stderr)
        return 2
    except SystemExit as exc:          # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    with _profile_restored(), settings.one_cpu_thread(), warnings.catch_warnings():
        # numpy's divide/overflow warnings from inside Triton's interpreter: a kernel's NaN or inf
        # is judged as a verdict (nonfinite, out_of_bounds_read ...), the warning only adds noise.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
        warnings.filterwarnings("ignore", message="Conversion of an array with ndim > 0 to a scalar",
                                category=DeprecationWarning)
        try:
            settings.choose_backend()
            _check_environment()
            return args.run(args)
        except (CLIError, settings.BackendError) as exc:
            print(f"fuzzattn: error: {flattened(exc)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("\nfuzzattn: error: interrupted", file=sys.stderr)
            return 130
        except SharedDeviceFault as exc:      # no verdict could be trusted (fuzzattn/platform/shared_gpu.py)
            print(f"fuzzattn: error: {flattened(exc)}", file=sys.stderr)
            return SHARED_DEVICE_FAULT_STATUS
        except Exception as exc:
            from fuzzattn.inputs.budget import CaseTooLargeError
            if isinstance(exc, BrokenPipeError) and _reader_gone():
                return READER_GONE_STATUS
            if isinstance(exc, CaseTooLargeError):
                print(f"fuzzattn: error: {flattened(exc)}", file=sys.stderr)
                return 2
            raise
