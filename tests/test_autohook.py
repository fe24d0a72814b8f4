"""FLOWRL_AUTOHOOK=1 + the sitecustomize on PYTHONPATH hooks every instance of the target class."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from flowrl.autohook import SITE_DIR

AGENT_MODULE = """
class MyAgent:
    async def a_run(self, query, session_id="default"):
        return await self.call_tool("echo", text=query)

    async def call_tool(self, name, **kw):
        return kw["text"].upper()
"""

APP = """
import asyncio, json, sys
import myagents
agent = myagents.MyAgent()
print(json.dumps({"answer": asyncio.run(agent.a_run("hello"))}))
import flowrl.autohook as ah
for h in ah.hooks:
    h.flush(timeout=10)
print(json.dumps({"hooks": len(ah.hooks)}))
"""


def _run(tmp_path: Path, enabled: bool) -> tuple[list[dict], Path]:
    (tmp_path / "myagents.py").write_text(AGENT_MODULE)
    (tmp_path / "app.py").write_text(APP)
    store = tmp_path / "store"
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(SITE_DIR), str(tmp_path)]),
        FLOWRL_STORE=str(store),
        FLOWRL_AUTOHOOK="1" if enabled else "0",
        FLOWRL_AUTOHOOK_TARGETS="myagents:MyAgent",
        FLOWRL_AUTOHOOK_RUN_METHODS="a_run",
        FLOWRL_AUTOHOOK_TOOL_METHODS="call_tool",
    )
    out = subprocess.run(
        [sys.executable, str(tmp_path / "app.py")], capture_output=True, text=True, env=env, timeout=120, check=True
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], store


def test_autohook_captures_every_new_instance(tmp_path: Path) -> None:
    lines, store = _run(tmp_path, enabled=True)
    assert lines[0] == {"answer": "HELLO"} and lines[1] == {"hooks": 1}
    files = list(store.rglob("*.json"))
    assert len(files) == 1
    trace = json.loads(files[0].read_text())
    assert trace["user_query"] == "hello" and trace["final_response"] == "HELLO"


def test_autohook_off_does_nothing(tmp_path: Path) -> None:
    lines, store = _run(tmp_path, enabled=False)
    assert lines == [{"answer": "HELLO"}, {"hooks": 0}]
    assert not store.exists()


def test_flowrl_instrument_prints_the_site_dir(capsys) -> None:
    from flowrl.autohook import main

    assert main(["--path"]) == 0
    assert capsys.readouterr().out.strip() == str(SITE_DIR)
