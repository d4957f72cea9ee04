"""Isolated judges for a whole run: one worker per implementation, and loading an implementation
whose probe call runs in a worker."""
from __future__ import annotations

import dataclasses

from fuzzattn.contract.implementation import Implementation
from fuzzattn.isolation.supervisor import DEFAULT_TIMEOUT, IsolatedJudge, IsolationError

__all__ = ["DEFAULT_TIMEOUT", "WorkerPool", "load_isolated"]


class WorkerPool:
    """One IsolatedJudge per implementation, started on first use and kept for the run (the
    replay commands, the pytest plugin's --fuzzattn-isolate: one per xdist worker process)."""

    def __init__(self, timeout: float | None = DEFAULT_TIMEOUT, device: str | None = None):
        self.timeout, self.device = timeout, device
        self._judges: dict[str, IsolatedJudge] = {}

    def get(self, impl: Implementation) -> IsolatedJudge:
        key = impl.cli_name
        if key not in self._judges:
            self._judges[key] = IsolatedJudge(impl, timeout=self.timeout, device=self.device)
        return self._judges[key]

    def close(self) -> None:
        judges, self._judges = self._judges, {}
        for isolated in judges.values():
            isolated.close()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load_isolated(spec: str, *, timeout: float | None = DEFAULT_TIMEOUT) -> Implementation:
    """`loader.load_implementation(spec)` with its probe call run in a worker process, so an
    implementation that hangs or crashes the process on the probe's case can still be fuzzed (and
    that failure found and shrunk by the campaign). The module itself is imported in this process
    too: its import-time code is not isolated."""
    from fuzzattn.run.loader import ImplementationLoadError, load_implementation
    impl = load_implementation(spec, probe=False)
    try:
        with IsolatedJudge(spec, timeout=timeout) as isolated:
            probed = isolated.probe()
    except IsolationError as exc:
        raise ImplementationLoadError(f"--impl {spec!r}: {exc}") from None
    return (dataclasses.replace(impl, caps=probed["caps"], probe_case=probed.get("probe_case"))
            if probed else impl)
