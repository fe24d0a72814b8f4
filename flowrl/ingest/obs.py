"""FlowAgent ObservabilityLayer files: `run_{run_id}.json` and `live_{run_id}.jsonl`
(docs/reference/flowagent-0.1.28.md §3.5).

`{data_dir}/Agents/{agent}/obs/` holds:

* `run_{run_id}.json`: one finished run (`RunRecord.to_dict`): query, session, timings, tokens, success
  (the model's `final_answer.success`), the final answer, and per step the last LLM call's input messages
  and the step's tool records. FlowAgent writes it with a plain `open(..., "w")`, so a reader can see it
  half written: the JSON then fails to parse and the file is retried or reported.
* `_index.json`: the ring buffer of run ids (only the newest `max_runs`, default 3, survive). Not needed
  to read runs; `discover` ignores it.
* `live_{run_id}.jsonl`: one step per line while a run is going, with `ctx_snapshot` (the whole
  `ExecutionContext.to_checkpoint()`) every few steps. Deleted when the run ends, so one that stays
  behind belongs to an interrupted run.

Both become a `RunView`: the transcript (see `transcript`), split into segments at auto-resume points.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from flowrl.errors import IngestError
from flowrl.ingest.checkpoint import text_of
from flowrl.ingest.transcript import (
    Segment,
    attach_records,
    calls_with_records,
    dedup_tool_results,
    from_steps,
    segments,
    split_steps,
)
from flowrl.ingest.unpickler import read_bytes

RUN_FILE_RE = re.compile(r"^run_([^./\\]+)\.json$")
LIVE_FILE_RE = re.compile(r"^live_([0-9A-Za-z_\-]+?)(?:\..*)?\.jsonl$")


@dataclass
class RunView:
    """One run as the obs layer saw it."""

    run_id: str
    agent: str | None
    session_id: str | None
    query: str
    path: Path
    kind: str  # "obs" (finished run file) or "live" (interrupted run)
    status: str | None
    data: dict[str, Any]  # run-level fields of the obs file (empty for live files)
    messages: list[dict[str, Any]]
    segments: list[Segment]
    transcript_source: str
    bad_lines: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.kind == "obs"


def agent_from_path(path: Path) -> str | None:
    """`.../Agents/{agent}/obs/<file>` -> agent."""
    parent = Path(path).parent
    return parent.parent.name if parent.name == "obs" and parent.parent.name else None


def _loads_json(raw: bytes, origin: str) -> Any:
    if not raw.strip():
        raise IngestError(f"{origin}: empty file")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise IngestError(f"{origin}: not valid JSON, truncated or corrupt ({exc})") from exc


def read_obs_run(path: Path, raw: bytes | None = None) -> RunView:
    path = Path(path)
    data = _loads_json(read_bytes(path) if raw is None else raw, str(path))
    if not isinstance(data, dict) or not isinstance(data.get("run_id"), str) or not isinstance(data.get("steps"), list):
        raise IngestError(f"{path}: not a FlowAgent obs run file (needs run_id and steps)")
    steps = [s for s in data["steps"] if isinstance(s, dict)]
    query = text_of(data.get("query"))
    msgs = attach_records(from_steps(steps, query), steps)
    run = RunView(
        run_id=data["run_id"],
        agent=data.get("agent_name") or agent_from_path(path),
        session_id=data.get("session_id"),
        query=query,
        path=path,
        kind="obs",
        status="completed",
        data={k: v for k, v in data.items() if k != "steps"},
        messages=msgs,
        segments=[],
        transcript_source="obs-steps",
        steps=steps,
    )
    _fill_segments(run)
    last = run.segments[-1]
    summary = data.get("final_answer_summary")
    if last.answer is None and isinstance(summary, str):
        last.answer = summary
    if isinstance(data.get("success"), bool):
        last.success = data["success"]
    return run


def read_live(path: Path, raw: bytes | None = None) -> RunView:
    """An interrupted run: the last `ctx_snapshot` gives the working history; later steps are appended."""
    path = Path(path)
    raw = read_bytes(path) if raw is None else raw
    lines = raw.splitlines()
    steps: list[dict[str, Any]] = []
    snapshot: dict[str, Any] | None = None
    bad = 0
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            step = orjson.loads(line)
        except orjson.JSONDecodeError:
            if n != len(lines) - 1:  # a half-written last line is normal; others are counted
                bad += 1
            continue
        if not isinstance(step, dict):
            bad += 1
            continue
        if isinstance(step.get("ctx_snapshot"), dict):
            snapshot = step["ctx_snapshot"]
        steps.append(step)
    if not steps:
        raise IngestError(f"{path}: live file has no complete step yet")
    if snapshot is None or not isinstance(snapshot.get("query"), str):
        raise IngestError(f"{path}: live file has no ctx_snapshot yet, so its query is unknown")
    history = [m for m in snapshot.get("working_history") or [] if isinstance(m, dict)]
    msgs = attach_records(dedup_tool_results(history), steps)  # adds the calls made after the snapshot
    m = LIVE_FILE_RE.match(path.name)
    run_id = str(snapshot.get("run_id") or (m.group(1) if m else path.stem))
    status = snapshot.get("status")
    run = RunView(
        run_id=run_id,
        agent=agent_from_path(path),
        session_id=snapshot.get("session_id"),
        query=snapshot["query"],
        path=path,
        kind="live",
        status="interrupted" if status in (None, "running") else str(status),
        data={},
        messages=msgs,
        segments=[],
        transcript_source="ctx_snapshot",
        bad_lines=bad,
        steps=steps,
    )
    _fill_segments(run)
    return run


def _fill_segments(run: RunView) -> None:
    segs = segments(run.messages, run.query)
    for seg, seg_steps in zip(segs, split_steps(run.steps, len(segs))):
        seg.steps = seg_steps
    for call in calls_with_records(run.messages, run.steps):
        for seg in segs:
            if seg.start <= call.message_index < seg.end:
                seg.calls.append(call)
                break
    run.segments = segs
