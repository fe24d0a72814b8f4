"""Stable trace ids, derived from content (never from wall-clock time or file names).

One user turn gets the same id whichever file it is read from (any of the checkpoint snapshots that
contain it, or the obs run file), so the store collapses them into one trace:

    sha256("flowagent-turn/1", agent, session_id, run_id, query, answer[:200], occurrence)[:16]

* `run_id` comes from the `RUN SUMMARY [run_id]` line (checkpoints) or the obs file. It makes identical
  queries in one session distinct turns.
* `query` is the *real* user text of the turn: for an auto-resumed run the follow-up from the obs or
  live transcript, never the original query that chat_history repeats (docs/reference/flowagent-0.1.28.md §3.6).
* `answer` is cut at 200 characters and stripped, so a shortened copy of the answer (obs summaries,
  argument summaries) still gives the same id.
* `occurrence` separates repeated identical (query, answer) turns that carry no run id (V1
  checkpoints, turns written outside the ReAct loop); it is 0 whenever there is a run id.

Interrupted runs (live files) use their own namespace, so a partial trace never shadows the completed
one that may follow.

Because the id does not depend on which file a turn came from, a richer file read later (the obs file
after the checkpoint) finds the poorer trace under the same id and upgrades it in place
(`flowrl.ingest.upgrade`).
"""

from __future__ import annotations

import hashlib

ANSWER_KEY_CHARS = 200


def norm(text: str | None) -> str:
    return (text or "").strip()


def answer_key(answer: str | None) -> str:
    return norm(answer)[:ANSWER_KEY_CHARS]


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
    return h.hexdigest()[:16]


def turn_id(
    agent: str | None,
    session_id: str | None,
    run_id: str | None,
    query: str | None,
    answer: str | None,
    occurrence: int = 0,
) -> str:
    """Id of a finished user turn (checkpoint, obs run file, finished segment of a live file)."""
    return _digest(
        "flowagent-turn/1",
        agent or "",
        session_id or "",
        run_id or "",
        norm(query),
        answer_key(answer),
        str(occurrence),
    )


def interrupted_id(agent: str | None, session_id: str | None, run_id: str | None, query: str | None) -> str:
    """Id of the unfinished last part of an interrupted run (live file without a run file)."""
    return _digest("flowagent-interrupted/1", agent or "", session_id or "", run_id or "", norm(query))


def content_id(raw: bytes) -> str:
    """Id for an imported trace file whose own trace_id cannot be used as a file name."""
    return "imp-" + hashlib.sha256(raw).hexdigest()[:16]
