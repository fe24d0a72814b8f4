"""Ingest what a real toolboxv2 0.1.28 FlowAgent writes, while `watch` is running on its data dir.

The agent runs offline in its own venv (tests/integration/toolbox_env.py; build it with
scripts/setup_toolboxv2_env.sh) through tests/integration/flowagent_driver.py --no-hook: a run with think
and a tool, an auto-resumed follow-up in the same session, a failing tool, a sidecar question while a
commit is pending, and an a_stream run whose turn never reaches a checkpoint (the lag).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flowrl.ingest import ingest_paths
from flowrl.ingest.watch import Watcher
from flowrl.store.files import TraceStore
from flowrl.trace.redact import redact_text

pytestmark = [
    pytest.mark.integration,
    # watchdog 7.1 warns when it re-adds a watch for a directory created during a burst; harmless here
    pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning"),
]

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("FLOWRL_TOOLBOX_VENV", REPO / ".venv-toolbox"))


@pytest.fixture(scope="module")
def toolbox_python() -> Path:
    py = VENV / "bin" / "python"
    if not (REPO / "tests" / "integration" / "toolbox_env.py").exists():
        pytest.skip("tests/integration/toolbox_env.py (the toolboxv2 sandbox helper) is not in this checkout")
    if not py.exists():
        pytest.skip(f"no toolboxv2 venv at {VENV}: build it with scripts/setup_toolboxv2_env.sh")
    return py


def test_real_flowagent_data_dir_while_watching(toolbox_python: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    try:
        from toolbox_env import sandbox_env
    finally:
        sys.path.pop(0)
    env = sandbox_env(tmp_path / "sandbox", VENV)
    tb_data = Path(env["TB_DATA_DIR"])
    store = TraceStore(tmp_path / "store")
    watcher = Watcher([tb_data], store, debounce=0.3, rescan_interval=5.0)
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), kwargs={"ready": ready}, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        out = tmp_path / "summary.json"
        proc = subprocess.run(
            [
                str(toolbox_python),
                str(REPO / "tests" / "integration" / "flowagent_driver.py"),
                "--no-hook",
                "--fast-exit",
                "--out",
                str(out),
            ],
            env=env,
            cwd=tmp_path / "sandbox",
            capture_output=True,
            text=True,
            timeout=600,
        )
        done = time.monotonic()
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs = json.loads(out.read_text())["baseline"]["runs"]
        expected = {
            (r["session_id"], redact_text(r["query"]), r["result"]) for name, r in runs.items() if name != "sidecar"
        }
        while time.monotonic() - done < 2.0:
            got = {(t.session_id, t.user_query, t.final_response) for t in store.iter_traces()}
            if got >= expected:
                break
            time.sleep(0.05)
        picked_up_s = time.monotonic() - done
    finally:
        stop.set()
        thread.join(10)
    traces = list(store.iter_traces())
    got = {(t.session_id, t.user_query, t.final_response) for t in traces}
    assert got == expected, f"after {picked_up_s:.2f} s"
    assert picked_up_s < 2.0
    assert len(traces) == 4  # one per user turn; the sidecar question has no persisted answer

    by_query = {t.user_query: t for t in traces}
    followup = by_query[runs["followup"]["query"]]
    assert followup.run_id == runs["weather"]["run_id"]  # the auto-resumed run keeps its run id
    assert followup.metadata["flowagent"]["auto_resumed"] is True
    assert [c.arguments for c in followup.tool_calls] == [{"city": "Rome"}]
    stock = by_query[runs["stock"]["query"]]
    assert stock.success is False and [c.success for c in stock.tool_calls] == [False]
    stream = by_query[runs["stream"]["query"]]
    assert stream.source == "obs"  # its turn never reached a checkpoint (the lag)
    secret = json.loads(out.read_text())["secret"]
    assert all(secret not in p.read_text() for p in store.iter_paths())

    # A one-shot ingest of the same data dir afterwards adds nothing.
    again = ingest_paths([tb_data], store)
    assert again.new == 0 and again.rejected_count == 0
