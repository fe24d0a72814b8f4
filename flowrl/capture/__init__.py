"""Live capture: `hook_into_agent(agent)` records every run of an agent as one trace.

See docs/capture.md. The pieces: `hook.py` (the entry point and the `Hook` handle), `events.py` (the
typed events, the shared handler factory and the adapter interface), `flowagent.py` and `generic.py`
(adapters: map a framework's calls onto events), `recorder.py` (per-run
state in a context variable; the hot path), `collector.py` (`TraceCollector`: one per store per
process, shared by every hook writing there; a hook is a `Registration` on it; the queue, the writer
thread and its I/O threads), `assemble.py` (record -> trace) and `masking.py` (secrets out), both on
the writer thread, `_patch.py` (class patches with an instance filter), `run_handle.py` (`current_run()`:
the host's handle on the run it is inside, to record its outcome), `grouping.py` (`capture_llm_calls`:
LLM client calls made outside any run, grouped into runs by conversation prefix; imported on first use).
"""

from __future__ import annotations

from flowrl._lazy import lazy_exports
from flowrl.capture.collector import CaptureStats, TraceCollector
from flowrl.capture.hook import Hook, hook_into_agent
from flowrl.capture.run_handle import RunHandle, current_run

__all__ = [
    "CallCapture",
    "CaptureStats",
    "Hook",
    "RunHandle",
    "TraceCollector",
    "capture_llm_calls",
    "current_run",
    "hook_into_agent",
]

_LAZY = {"capture_llm_calls": "flowrl.capture.grouping", "CallCapture": "flowrl.capture.grouping"}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, [n for n in __all__ if n not in _LAZY])
