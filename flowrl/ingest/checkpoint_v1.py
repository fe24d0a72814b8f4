"""V1 checkpoints: `toolboxv2.mods.isaa.base.Agent.types.AgentCheckpoint` (toolboxv2 <= 0.1.25;
docs/reference/flowagent-0.1.28.md §3.7).

Fields: `timestamp, agent_state, task_state, world_model, active_flows, metadata{session_id, last_query,
checkpoint_version, agent_name}, session_data{sid: {history: [...], session_type}}, conversation_history,
variable_scopes, ...`. Turns come from `session_data[sid]["history"]`; when no session holds any history,
from `conversation_history` under `metadata.session_id`. V1 messages have no run ids; they may carry a
`timestamp`. `agent_state` token counters are lifetime totals and are not spread over turns.
"""

from __future__ import annotations

import logging
from pathlib import Path

from flowrl.errors import IngestError
from flowrl.ingest.checkpoint import Checkpoint, SessionHistory, dated
from flowrl.ingest.unpickler import V1Checkpoint

log = logging.getLogger(__name__)


def read_v1(path: Path, cp: V1Checkpoint) -> Checkpoint:
    state = cp.__dict__
    metadata, agent_state = state.get("metadata"), state.get("agent_state")
    metadata = metadata if isinstance(metadata, dict) else {}
    agent_state = agent_state if isinstance(agent_state, dict) else {}
    amd = agent_state.get("amd_data")
    amd = amd if isinstance(amd, dict) else {}
    agent = metadata.get("agent_name") or amd.get("name") or path.parent.name
    session_data = state.get("session_data") or {}
    if not isinstance(session_data, dict):
        raise IngestError(
            f"{path}: unexpected V1 checkpoint structure: session_data is a {type(session_data).__name__}, not a dict"
        )
    sessions: list[SessionHistory] = []
    for sid, info in session_data.items():
        history = info.get("history") if isinstance(info, dict) else None
        if isinstance(history, list) and history:
            sessions.append(SessionHistory(str(sid), history))
    if not sessions:
        conversation = state.get("conversation_history")
        if isinstance(conversation, list) and conversation:
            sessions.append(SessionHistory(str(metadata.get("session_id") or "default"), conversation))
    version = str(metadata.get("checkpoint_version") or "1")
    return dated(path, "v1", agent, version, sessions, state.get("timestamp"))
