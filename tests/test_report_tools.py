"""The report's tool table lists the tools a run offered, not every name a model invented (issue 39)."""

from __future__ import annotations

from pathlib import Path

from flowrl.store.files import TraceStore


def test_the_report_does_not_list_invented_tool_names_as_tools(tmp_path: Path) -> None:
    """Issue 39: "French", "Capital of Germany" and "Berlin" were listed as tools."""
    from flowrl.report.metrics import UNDECLARED, store_metrics
    from flowrl.trace.schema import ExecutionTrace, ToolCallTrace

    store = TraceStore(tmp_path / "store")
    schema = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    calls = [ToolCallTrace(tool_name=n, arguments={}, result="x") for n in ("lookup", "Berlin", "French")]
    store.write(ExecutionTrace(user_query="q", tools=[schema], tool_calls=calls, final_response="a"))
    store.write(ExecutionTrace(user_query="q2", tool_calls=[ToolCallTrace(tool_name="search", result="y")]))
    tools = store_metrics(store).tools
    assert set(tools) == {"lookup", UNDECLARED, "search"}  # a run that declares no tools: names as they are
    assert tools[UNDECLARED].calls == 2
