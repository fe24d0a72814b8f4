"""V2 checkpoints: `toolboxv2.mods.isaa.base.Agent.checkpoint_manager.AgentCheckpoint`
(docs/reference/flowagent-0.1.28.md §3.2-3.4).

Read: `version`, `timestamp`, `agent_name`, and per session `sessions_data["sessions"][sid]["chat_history"]`
and `max_history`. `statistics` are the agent's lifetime totals and are deliberately not used for
per-turn figures (they would have to be guessed); per-turn tokens come from obs files or stay null.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flowrl.errors import IngestError
from flowrl.ingest.checkpoint import Checkpoint, SessionHistory, dated
from flowrl.ingest.unpickler import V2Checkpoint

log = logging.getLogger(__name__)

SUPPORTED_MAJOR = "2"
_warned_missing: set[str] = set()


def _missing(field_name: str, path: Path, filled: Any) -> Any:
    """A field a checkpoint should have is absent: fill it and say so, once per field and process."""
    if field_name not in _warned_missing:
        _warned_missing.add(field_name)
        log.warning("flowrl: %s has no %r field; using %r (logged once)", path, field_name, filled)
    return filled


def read_v2(path: Path, cp: V2Checkpoint) -> Checkpoint:
    state = cp.__dict__
    version = state.get("version")
    if version is None:
        version = _missing("version", path, "2.0")
    version = str(version)
    if version.split(".")[0] != SUPPORTED_MAJOR:
        raise IngestError(
            f"{path}: unsupported checkpoint version {version!r}: this flowrl reads version 2.x "
            f"(and V1 checkpoints by their class)"
        )
    agent = state.get("agent_name") or _missing("agent_name", path, path.parent.name)
    sessions_data = state.get("sessions_data")
    if sessions_data is None:
        sessions_data = _missing("sessions_data", path, {})
    if not isinstance(sessions_data, dict):
        raise IngestError(
            f"{path}: unexpected checkpoint structure: sessions_data is a {type(sessions_data).__name__}, not a dict"
        )
    sessions = sessions_data.get("sessions") or {}
    if not isinstance(sessions, dict):
        raise IngestError(
            f"{path}: unexpected checkpoint structure: sessions_data['sessions'] is a "
            f"{type(sessions).__name__}, not a dict"
        )
    default_max = sessions_data.get("default_max_history")
    out: list[SessionHistory] = []
    for sid, session in sessions.items():
        if not isinstance(session, dict):
            log.warning("flowrl: %s: session %r is a %s, not a dict; skipped", path, sid, type(session).__name__)
            continue
        history = session.get("chat_history") or []
        if not isinstance(history, list):
            log.warning("flowrl: %s: session %r chat_history is not a list; skipped", path, sid)
            continue
        max_history = session.get("max_history", default_max)
        out.append(
            SessionHistory(
                str(session.get("session_id") or sid), history, max_history if isinstance(max_history, int) else None
            )
        )
    return dated(path, "v2", agent, version, out, state.get("timestamp"))
