"""ToolSuccessReward: the share of tool calls that truly succeeded.

Reads the trace's tool calls (`flowrl.trace.facts.tool_calls`: `tool_calls` plus the transcript's calls no entry
records). Whether a call failed is `flowrl.trace.facts.tool_failed`, the rule capture, ingest and the report use:
the framework said so, it carries an error, its result starts with `Error` / `System-Error`, a Python
traceback sits inside a "success" result (FlowAgent's `exec_code` reports `{'success': True, ...}` for code
that raised), or the result is a dict (or its text) with `success: False`.
`final_answer` is not counted: it ends the run, it does not act.

None when the trace made no tool calls, or none of them has a result yet (a fresh completion that only
asked for a call).
"""

from __future__ import annotations

from typing import Any

from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.views import CONTROL_TOOLS, tool_calls
from flowrl.trace.schema import ExecutionTrace


class ToolSuccessReward(Reward):
    name = "tool_success"

    def __init__(self, ignore_tools: list[str] | tuple[str, ...] = tuple(CONTROL_TOOLS)) -> None:
        self.ignore_tools = frozenset(ignore_tools)

    def score(self, trace: ExecutionTrace) -> RewardResult:
        views = [v for v in tool_calls(trace, include_control=True) if v.name not in self.ignore_tools]
        judged = [(v, v.failed) for v in views]
        counted = [(v, f) for v, f in judged if f is not None]
        details: dict[str, Any] = {"calls": len(views), "counted": len(counted)}
        if not counted:
            details["reason"] = "no tool calls" if not views else "no tool results to judge"
            return RewardResult(None, details)
        failed = [v for v, f in counted if f]
        details["failed"] = len(failed)
        if failed:
            details["failed_tools"] = [v.name for v in failed][:10]
            reported_ok = [v.name for v in failed if v.success is True]
            if reported_ok:
                details["reported_success_but_failed"] = reported_ok[:10]
        return RewardResult((len(counted) - len(failed)) / len(counted), details)
