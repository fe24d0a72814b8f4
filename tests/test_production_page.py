"""docs/production.md runs as written (issue 36): hook an agent on a served model, record outcomes, label a run,
`flowrl improve --from-store`, verify the eval, serve the adapter. The page's blocks become one bash script, as
the quickstart's do (`test_quickstart.page_script`), run in a temporary folder with PRODUCTION_STEPS=1."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from test_quickstart import page_env, page_script

from flowrl.store.files import TraceStore

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "production.md"


def test_the_page_parses_and_walks_the_whole_path(tmp_path: Path) -> None:
    script, skipped = page_script(PAGE.read_text(encoding="utf-8"), tmp_path)
    assert skipped == ["make setup", "source .venv/bin/activate"]
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert {p.name for p in tmp_path.glob("*.py")} == {"my_agent.py", "my_app.py"}
    for step in ("flowrl serve default", "python my_app.py", "flowrl traces label", "--from-store", "verify(data)",
                 "flowrl serve out/production/round-1/adapter"):  # fmt: skip
        assert step in script, step


@pytest.mark.slow
def test_the_production_page_runs_top_to_bottom(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    folder = tmp_path / "clone"
    folder.mkdir()
    script, _ = page_script(PAGE.read_text(encoding="utf-8"), folder)
    env = {**page_env(folder), "PRODUCTION_STEPS": "1"}
    started = time.monotonic()
    done = subprocess.run(["bash", "-euo", "pipefail"], input=script, cwd=folder, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 0, f"the page failed after {took:.0f} s:\n{done.stderr[-6000:]}\n{done.stdout[-3000:]}"

    traces = list(TraceStore(folder / "home" / "traces").iter_traces())
    assert len(traces) == 25 and all(t.llm_calls for t in traces)  # the OpenAI calls were captured
    assert sum(bool(t.outcomes) for t in traces) == 12
    assert [t for t in traces if t.label is False and t.label_source == "manual"]
    assert (folder / "out" / "production" / "round-1" / "adapter" / "adapter_config.json").is_file()
    assert "base" in done.stdout and "round-1" in done.stdout  # the eval's table
    print(f"the production page ran in {took:.0f} s")
