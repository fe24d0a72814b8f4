"""`flowrl.current_run()`: the captured run the calling code is inside, so the host can say how it went.

    run = flowrl.current_run()          # inside a hooked agent's run (its tools, its LLM calls, to_thread)
    if run is not None:
        run.record_outcome(reference="84", source="app")
    ...                                  # later, with the id kept: hook.record_outcome(run.trace_id, success=False)

The run is the one in capture's context variable (`recorder.current_frame`), so the handle follows asyncio tasks and
`asyncio.to_thread`; a plain `threading.Thread` starts without it (pass the handle along). Outside a captured run
`current_run()` is None; it never raises. `record_outcome` never raises either: a bad value is counted in the
hook's `stats.outcome_errors` and logged, and it returns False.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from flowrl.capture.recorder import RunRecord, current_frame

if TYPE_CHECKING:  # pragma: no cover
    from flowrl.capture.hook import Hook


class RunHandle:
    """One captured run, as the host sees it: its `trace_id` (the stored trace's id) and `record_outcome`."""

    __slots__ = ("_run",)

    def __init__(self, run: RunRecord) -> None:
        self._run = run

    @property
    def trace_id(self) -> str:
        return self._run.trace_id

    @property
    def agent_name(self) -> str | None:
        return self._run.hook.agent_name

    def record_outcome(
        self,
        *,
        reference: Any = None,
        success: bool | None = None,
        rewards: Mapping[str, float] | None = None,
        feedback: str | None = None,
        source: str = "app",
    ) -> bool:
        """Say how this run went (every field optional; see `flowrl.trace.outcomes`). During the run it is written
        with the trace; after, on its own. True when it was accepted for writing."""
        hook = cast("Hook", self._run.hook)  # a run's hook is a Hook (the recorder knows it as a HookPort)
        outcome = hook.make_outcome(
            reference=reference, success=success, rewards=rewards, feedback=feedback, source=source
        )
        if outcome is None:
            return False
        if self._run.add_outcome(outcome):
            return True
        return hook.record_outcome(self._run.trace_id, outcome)

    def __repr__(self) -> str:
        return f"<flowrl run {self.trace_id}>"


def current_run() -> RunHandle | None:
    """The captured run the calling code is inside, or None."""
    try:
        frame = current_frame()
        return None if frame is None else RunHandle(frame[0])
    except Exception:  # pragma: no cover - defensive: never raise into the host
        return None
