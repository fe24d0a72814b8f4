"""FlowAgent checkpoints as flowrl reads them: `Checkpoint`, its `SessionHistory` objects, and `split_turns`.

`flowrl.ingest.checkpoint_read.load_checkpoint(path)` returns a `Checkpoint` whatever the version: V2
(`checkpoint_manager.AgentCheckpoint`, toolboxv2 >= 0.1.27, `checkpoint_v2`) or V1 (`types.AgentCheckpoint`, the
older agent, `checkpoint_v1`). `split_turns` turns a session's messages into `ChatTurn`s.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.ingest.times import file_time, name_time, time_text, valid_time
from flowrl.trace.transcript import content_text

log = logging.getLogger(__name__)

RUN_SUMMARY_RE = re.compile(r"^RUN SUMMARY \[([^\]\s]{1,64})\]")
_NAME_TS_RE = re.compile(r"agent_checkpoint_(\d{8}_\d{6})\.pkl$")
CHECKPOINT_NAME_RE = re.compile(r"^(?:agent_checkpoint_\d{8}_\d{6}|final_checkpoint)\.pkl$")


@dataclass
class SessionHistory:
    session_id: str
    messages: list[dict[str, Any]]
    max_history: int | None = None  # messages beyond this were dropped, oldest first


@dataclass
class Checkpoint:
    path: Path
    kind: str  # "v2" or "v1"
    agent: str
    timestamp: str  # ISO, a real time: see `checkpoint_time`
    version: str
    sessions: list[SessionHistory] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # oddities met while reading it (counted in the summary)


@dataclass
class ChatTurn:
    """One user turn in a session's permanent history."""

    session_id: str
    index: int  # position of the user message
    query: str
    answer: str | None  # the last assistant message that is not the RUN SUMMARY line
    run_id: str | None = None
    occurrence: int = 0  # n-th turn of this run id in the session (n-th equal turn when there is none)
    ambiguous_head: bool = False  # first run-id group of a history that may have lost its oldest messages
    timestamp: str | None = None  # V1 messages carry one; as written (it is part of the id), maybe no real time
    tool_messages: int = 0


def text_of(content: Any) -> str:
    """Message content as text (OpenAI list-of-parts content is joined): the transcript module's rule."""
    return content_text(content)


BAD_NAME_TIME = "checkpoint file name with an impossible time"
NO_TIME = "checkpoint with no real time in its name or contents"


def checkpoint_time(path: Path, pickled: Any) -> tuple[str, str | None]:
    """The checkpoint's time, and a note when it could not come from where it should.

    FlowAgent names the file after the moment it saved it (`agent_checkpoint_YYYYmmdd_HHMMSS.pkl`), so
    that time comes first. A name whose time cannot be (`20261399_999999`: someone else's file, or a
    renamed one) falls back to the time pickled in the file, then to the file's modification time."""
    match = _NAME_TS_RE.search(path.name)
    named = name_time(match.group(1)) if match else None
    if named is not None:
        return named, None
    contents = valid_time(pickled)
    if match is not None:
        if contents is not None:
            return contents, f"{BAD_NAME_TIME} (the time pickled in the file was used)"
        mtime = file_time(path)
        return mtime or "", f"{BAD_NAME_TIME} (the file's modification time was used)"
    if contents is not None:
        return contents, None
    note = f"{NO_TIME} (the file's modification time was used)" if pickled is not None else None
    return file_time(path) or "", note


def dated(
    path: Path, kind: str, agent: Any, version: str, sessions: list[SessionHistory], pickled_time: Any
) -> Checkpoint:
    """A checkpoint read from `path`, its time from `checkpoint_time` (a note when it could not come from
    where it should): what both readers (`checkpoint_v1`, `checkpoint_v2`) hand back."""
    timestamp, note = checkpoint_time(path, pickled_time)
    return Checkpoint(path, kind, str(agent), timestamp, version, sessions, [note] if note else [])


def _role(m: Any) -> str:
    return m.get("role", "") if isinstance(m, dict) else ""


def split_turns(history: SessionHistory) -> Iterator[ChatTurn]:
    """Group messages into turns: a user message, then everything up to the next user message.

    The answer is the last assistant message that is not `RUN SUMMARY [run_id]: ...` (that line only
    gives the run id). A user message with no answer after it (a sidecar question, a commit still in
    progress) yields a turn with `answer=None`.
    """
    msgs = [m for m in history.messages if isinstance(m, dict)]
    # A history at its cap (or one that starts in the middle of a turn) may have lost its oldest
    # messages: its first run-id group might have started earlier, as an auto-resumed run.
    truncated = bool(msgs) and (
        _role(msgs[0]) != "user" or (history.max_history is not None and len(history.messages) >= history.max_history)
    )
    head_run: str | None = None
    if truncated:
        for m in msgs:
            if _role(m) == "assistant":
                hit = RUN_SUMMARY_RE.match(text_of(m.get("content")))
                if hit:
                    head_run = hit.group(1)
                    break
    runs_seen: dict[str, int] = {}
    pairs_seen: dict[tuple[str, str | None], int] = {}
    i = 0
    while i < len(msgs):
        if _role(msgs[i]) != "user":
            i += 1
            continue
        turn = ChatTurn(
            session_id=history.session_id,
            index=i,
            query=text_of(msgs[i].get("content")),
            answer=None,
            timestamp=time_text(msgs[i].get("timestamp")),
        )
        j = i + 1
        while j < len(msgs) and _role(msgs[j]) != "user":
            m = msgs[j]
            if _role(m) == "assistant":
                content = text_of(m.get("content"))
                hit = RUN_SUMMARY_RE.match(content)
                if hit and turn.run_id is None:
                    turn.run_id = hit.group(1)
                elif not hit:
                    turn.answer = content
            elif _role(m) == "tool":
                turn.tool_messages += 1
            j += 1
        if turn.run_id is not None:
            turn.occurrence = runs_seen.get(turn.run_id, 0)
            runs_seen[turn.run_id] = turn.occurrence + 1
            turn.ambiguous_head = truncated and turn.run_id == head_run
        elif turn.answer is not None:
            key = (turn.query, turn.answer)
            turn.occurrence = pairs_seen.get(key, 0)
            pairs_seen[key] = turn.occurrence + 1
        yield turn
        i = j
