"""Regression files as pytest items: one item per implementation that supports the file's case
(`regressions/<key>.json::sdpa`), and one failing item for a file that cannot be used, so
collection itself never errors."""
from __future__ import annotations

import pytest


class RegressionFileNode(pytest.File):
    """A regression file. `judge_for(impl, needed)` gives the judge function a replay uses
    (None: in-process), where `needed` says the file records a verdict only a worker can give."""

    def __init__(self, *, judge_for, **kwargs):
        super().__init__(**kwargs)
        self.judge_for = judge_for

    def collect(self):
        from fuzzattn import settings
        from fuzzattn.campaigns.regression_file import RegressionFileError, load
        try:
            record = load(self.path)
        except RegressionFileError as exc:
            yield BrokenFileItem.from_parent(self, name="unreadable", message=str(exc))
            return
        except Exception as exc:      # collection never errors: this file fails, the rest run
            yield BrokenFileItem.from_parent(self, name="unreadable",
                                             message=f"{self.path}: {type(exc).__name__}: {exc}")
            return
        impls = [impl for impl in settings.implementations()
                 if impl.supports(record.case) or impl.name in record.expected_failures]
        if not impls:
            yield BrokenFileItem.from_parent(
                self, name="unsupported", skip=True,
                message=f"no registered implementation declares {record.case}")
        for impl in impls:
            yield RegressionItem.from_parent(self, name=impl.name, record=record, impl=impl,
                                             judge_for=self.judge_for)


class RegressionFailure(AssertionError):
    pass


class RegressionItem(pytest.Item):
    def __init__(self, *, record, impl, judge_for, **kwargs):
        super().__init__(**kwargs)
        self.record = record
        self.impl = impl
        self.judge_for = judge_for

    def runtest(self):
        from fuzzattn.campaigns.outcome import SKIP, XFAIL
        from fuzzattn.campaigns.file_replay import needs_isolation, replay_one
        judge_fn = self.judge_for(self.impl, needs_isolation(self.record, self.impl))
        outcome = replay_one(self.record, self.impl, judge_fn=judge_fn)
        if outcome.verdict == SKIP:
            pytest.skip(outcome.message)
        if outcome.verdict == XFAIL:
            pytest.xfail(outcome.message)
        if not outcome.passed:
            raise RegressionFailure(outcome.message)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, RegressionFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"replay {self.path.name} on {self.impl.name}"


class BrokenFileItem(pytest.Item):
    def __init__(self, *, message, skip=False, **kwargs):
        super().__init__(**kwargs)
        self.message = message
        self.skip = skip

    def runtest(self):
        if self.skip:
            pytest.skip(self.message)
        raise RegressionFailure(self.message)

    def repr_failure(self, excinfo):
        return str(excinfo.value)

    def reportinfo(self):
        return self.path, None, f"regression file {self.path.name}"
