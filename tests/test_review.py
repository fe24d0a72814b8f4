"""`flowrl review`: the queue, the pages, labels through the store on both layouts, security, DPO and KTO effects."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")

from starlette.testclient import TestClient  # noqa: E402

from flowrl.cli import main  # noqa: E402
from flowrl.data import DatasetFilter, DatasetPipeline  # noqa: E402
from flowrl.data.synthetic import synthetic_trace  # noqa: E402
from flowrl.methods import make_builder  # noqa: E402
from flowrl.review.app import create_app  # noqa: E402
from flowrl.review.queue import QueueFilter  # noqa: E402
from flowrl.store.files import TraceStore  # noqa: E402
from flowrl.store.opener import open_store  # noqa: E402
from flowrl.trace.schema import ExecutionTrace  # noqa: E402

LOCAL = "http://127.0.0.1"
HOSTILE_ANSWER = "<img src=x onerror=alert(1)> <script>alert('answer')</script>"
HOSTILE_TOOL = '<a href="javascript:alert(2)">click</a> ![x](http://evil/beacon.png) <script>alert(3)</script>'


def hostile_trace(trace_id: str = "hostile1") -> ExecutionTrace:
    """A run whose answer and tool result try to run script, open links and load images from elsewhere."""
    return ExecutionTrace(
        trace_id=trace_id,
        timestamp="2026-11-01T12:00:00",
        user_query="<b>bold?</b> What is 2+2?",
        final_response=HOSTILE_ANSWER,
        agent_name="<script>alert(4)</script>",
        messages=[
            {"role": "system", "content": "be careful"},
            {"role": "user", "content": "<b>bold?</b> What is 2+2?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "fetch", "arguments": '{"url": "<svg/onload=alert(5)>"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "name": "fetch", "content": HOSTILE_TOOL},
            {"role": "assistant", "content": HOSTILE_ANSWER},
        ],
        reward_score=0.2,
        rewards={"task_completion": 0.0},
        reward_details={"task_completion": {"failed": "<script>alert(6)</script>"}},
        metadata={"reference_answer": "<iframe src=//evil></iframe>4"},
    )


def fill(store: Any, n: int = 12, n_tasks: int = 4) -> list[ExecutionTrace]:
    traces = [synthetic_trace(i, n_tasks=n_tasks) for i in range(n)]
    store.write_many(traces)
    if hasattr(store, "flush"):
        store.flush()
    return traces


def client(store: Any, **kwargs: Any) -> TestClient:
    return TestClient(create_app(store, **kwargs), base_url=LOCAL)


def csrf_of(html: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', html)
    assert found, "the page carries its CSRF token"
    return found.group(1)


def label(c: TestClient, trace_id: str, verdict: str, notes: str = "") -> Any:
    token = csrf_of(c.get("/").text)
    return c.post(
        "/api/label", json={"trace_id": trace_id, "label": verdict, "notes": notes}, headers={"X-CSRF-Token": token}
    )


@pytest.fixture
def store(tmp_path: Path) -> TraceStore:
    s = TraceStore(tmp_path / "traces")
    fill(s)
    return s


def test_queue_shows_unlabelled_first_and_filters(store: TraceStore) -> None:
    c = client(store, fit=False)
    assert label(c, "syn0x0000000", "good").status_code == 200
    page = c.get("/")
    assert page.status_code == 200
    order = re.findall(r'href="/t/(syn0x\d+)"', page.text)
    assert len(order) == 12 and order[-1] == "syn0x0000000"  # labelled by hand: last
    assert 'data-next="/t/syn0x0000001"' in page.text
    only = c.get("/?label=manual")
    assert re.findall(r'href="/t/(syn0x\d+)', only.text) == ["syn0x0000000"]
    high = c.get("/?min_reward=0.6&sort=oldest")
    assert all(store.get(i).reward_score >= 0.6 for i in re.findall(r'href="/t/(syn0x\d+)', high.text))
    assert c.get("/?since=2026-12-01").text.count('href="/t/') == 0
    assert c.get("/?agent=nobody").text.count('href="/t/') == 0
    assert c.get("/?sort=sideways").status_code == 400


def test_disagreements_sort_puts_model_and_engine_conflicts_first(store: TraceStore) -> None:
    from flowrl.review.queue import Reviewer

    reviewer = Reviewer(store)
    reviewer.suggester.reward.state = {"stub": True}  # trained: the prediction below decides
    reviewer.suggester.reward.probability = lambda t: 0.9  # type: ignore[method-assign]
    rows = reviewer.rows(QueueFilter(sort="disagreements"))
    first_agree = next(i for i, r in enumerate(rows) if not r.disagrees)
    assert first_agree > 0 and all(r.label is False for r in rows[:first_agree])
    assert all(not r.disagrees for r in rows[first_agree:])


def test_trace_page_shows_the_run_and_escapes_everything(tmp_path: Path) -> None:
    s = TraceStore(tmp_path)
    s.write(hostile_trace())
    page = client(s, fit=False).get("/t/hostile1")
    assert page.status_code == 200
    body = page.text
    assert "<script>alert" not in body and "<img src=x" not in body and "<iframe" not in body and "<svg" not in body
    assert 'href="javascript:' not in body and "<b>bold" not in body
    assert "&lt;img src=x onerror=alert(1)&gt;" in body and "&lt;script&gt;alert(6)" in body
    assert "![x](http://evil/beacon.png)" in body  # markdown stays text: never an <img>
    assert len(re.findall(r"<script\b", body)) == 1 and '<script src="/static/review.js" defer></script>' in body
    for shown in (
        "system",
        "tool",
        "fetch",
        "Final answer",
        "Reference answer",
        "task_completion",
        "tokens in",
        "cost",
    ):
        assert shown in body
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'self'" in csp and "img-src 'self'" in csp
    assert "unsafe-inline" not in csp and "http" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"


def test_long_text_is_folded(tmp_path: Path) -> None:
    s = TraceStore(tmp_path)
    t = synthetic_trace(0)
    t.messages[3]["content"] = "line\n" * 400
    s.write(t)
    body = client(s, fit=False).get(f"/t/{t.trace_id}").text
    assert "<details" in body and "2,000 characters" in body


def test_state_changes_need_the_csrf_token_and_json(store: TraceStore) -> None:
    c = client(store, fit=False)
    body = {"trace_id": "syn0x0000001", "label": "bad"}
    assert c.post("/api/label", json=body).status_code == 403
    assert c.post("/api/label", json=body, headers={"X-CSRF-Token": "guess"}).status_code == 403
    token = csrf_of(c.get("/").text)
    form = c.post("/api/label", data=body, headers={"X-CSRF-Token": token})
    assert form.status_code == 415
    assert c.post("/api/refit", json={}).status_code == 403
    assert store.get("syn0x0000001").label_source == "engine"  # nothing was written
    assert c.post("/api/label", json={**body, "label": "maybe"}, headers={"X-CSRF-Token": token}).status_code == 400
    assert c.post("/api/label", json={**body, "trace_id": "../x"}, headers={"X-CSRF-Token": token}).status_code == 400
    assert c.post("/api/label", json={**body, "trace_id": "nope"}, headers={"X-CSRF-Token": token}).status_code == 404


def test_only_local_host_names_are_answered_without_a_token(store: TraceStore) -> None:
    c = client(store, fit=False)
    assert c.get("/", headers={"host": "127.0.0.1:8765"}).status_code == 200
    assert c.get("/", headers={"host": "localhost"}).status_code == 200
    assert c.get("/", headers={"host": "attacker.example:8765"}).status_code == 403  # DNS rebinding


def test_a_token_is_asked_once_then_kept_in_a_strict_cookie(store: TraceStore) -> None:
    c = TestClient(create_app(store, token="s3cret", fit=False), base_url="http://review.lan:8765")
    assert c.get("/").status_code == 401
    assert c.get("/?token=wrong").status_code == 401
    first = c.get("/t/syn0x0000002?token=s3cret&sort=oldest", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/t/syn0x0000002?sort=oldest"
    cookie = first.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert c.get("/t/syn0x0000002").status_code == 200


@pytest.mark.parametrize("layout", ["json", "segments"])
def test_labels_land_where_the_cli_would(tmp_path: Path, layout: str) -> None:
    s = open_store(tmp_path / "s", layout=layout)
    fill(s, 6)
    c = client(s, fit=False)
    assert label(c, "syn0x0000003", "bad", "wrong sum").json()["labelled_today"] == 1
    assert label(c, "syn0x0000004", "good").status_code == 200
    fresh = open_store(tmp_path / "s", layout=layout)  # a new object: what is on disk
    bad, good = fresh.get("syn0x0000003"), fresh.get("syn0x0000004")
    assert (bad.label, bad.label_source, bad.manual_review, bad.review_notes) == (False, "manual", True, "wrong sum")
    assert (good.label, good.manual_review) == (True, True)
    assert main(["traces", "ls", "--ids", "--label", "bad", "--store", str(tmp_path / "s")]) == 0


def test_two_reviewers_at_once_the_later_label_wins_whole(store: TraceStore) -> None:
    apps = [client(store, fit=False), client(TraceStore(store.root), fit=False)]
    tokens = [csrf_of(c.get("/").text) for c in apps]

    def give(k: int) -> None:
        for i in range(10):
            verdict = "good" if (i + k) % 2 else "bad"
            apps[k].post(
                "/api/label",
                json={"trace_id": "syn0x0000005", "label": verdict, "notes": f"{k}:{i}"},
                headers={"X-CSRF-Token": tokens[k]},
            )

    threads = [threading.Thread(target=give, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    last = TraceStore(store.root).get("syn0x0000005")  # parses: no write corrupted it
    assert last.label_source == "manual" and last.review_notes in ("0:9", "1:9")
    assert (
        apps[0]
        .post(
            "/api/label",
            json={"trace_id": "syn0x0000005", "label": "good", "notes": "final"},
            headers={"X-CSRF-Token": tokens[0]},
        )
        .status_code
        == 200
    )
    assert TraceStore(store.root).get("syn0x0000005").review_notes == "final"


def test_refit_learns_from_labels_and_reports_agreement(tmp_path: Path) -> None:
    s = TraceStore(tmp_path)
    traces = fill(s, 30, n_tasks=30)
    c = client(s, min_labels=10)
    page = c.get(f"/t/{traces[0].trace_id}")
    assert "not enough labels yet (0 of 10" in page.text
    for t in traces[:24]:
        assert label(c, t.trace_id, "good" if t.success else "bad").status_code == 200
    token = csrf_of(page.text)
    refit = c.post("/api/refit", json={}, headers={"X-CSRF-Token": token}).json()
    assert refit["trained"] and "fitted on 24 labels" in refit["status"]
    later = c.get(f"/t/{traces[27].trace_id}").text
    assert 'id="suggestion"' in later and "confidence" in later
    assert re.search(r"stored labels:\s+\d+ of 24 \(\d+%\)", later)
    assert label(c, traces[27].trace_id, "good" if traces[27].success else "bad").status_code == 200
    assert "as shown: 1 of 1" in c.get("/").text


def test_best_and_worst_of_a_group_become_the_dpo_pair(tmp_path: Path) -> None:
    s = TraceStore(tmp_path)
    traces = fill(s, 12, n_tasks=4)
    groups = [[t for t in traces if t.user_query == q] for q in sorted({t.user_query for t in traces})]
    group = next(g for g in groups if len({t.success for t in g}) == 2)  # a right and a wrong run
    ranked = sorted(group, key=lambda t: t.reward_score or 0)
    best, worst = ranked[0], ranked[-1]  # the person overrules the rewards: the lowest-rewarded run is the best
    c = client(s, fit=False)
    page = c.get(f"/t/{best.trace_id}").text
    group_id = re.search(r'href="/group/([0-9a-f]+)', page).group(1)  # type: ignore[union-attr]
    columns = c.get(f"/group/{group_id}").text
    assert all(f'data-trace-id="{t.trace_id}"' in columns for t in group)
    body = {"group_id": group_id, "best": best.trace_id, "worst": worst.trace_id}
    assert c.post("/api/pick", json=body, headers={"X-CSRF-Token": csrf_of(columns)}).status_code == 200
    fresh = TraceStore(tmp_path)
    assert fresh.get(best.trace_id).review_notes == f"review: best of group {group_id}"
    assert fresh.get(worst.trace_id).label is False
    dd = DatasetPipeline(make_builder("dpo"), val_fraction=0.0, filters=DatasetFilter(dedupe=False)).to_dataset_dict(
        fresh
    )
    pairs = {(r["chosen_trace_id"], r["rejected_trace_id"]) for r in dd["train"]}
    assert (best.trace_id, worst.trace_id) in pairs
    bad = {"group_id": group_id, "best": best.trace_id, "worst": best.trace_id}
    assert c.post("/api/pick", json=bad, headers={"X-CSRF-Token": csrf_of(columns)}).status_code == 400


def test_labels_change_what_kto_emits(tmp_path: Path) -> None:
    s = TraceStore(tmp_path)
    traces = fill(s, 12, n_tasks=12)

    def kto() -> dict[str, bool]:
        dd = DatasetPipeline(make_builder("kto"), val_fraction=0.0).to_dataset_dict(TraceStore(tmp_path))
        return dict(zip(dd["train"]["trace_id"], dd["train"]["label"], strict=True))

    before = kto()
    c = client(s, fit=False)
    flipped = [t for t in traces[:3]]
    for t in flipped:
        assert label(c, t.trace_id, "bad" if before[t.trace_id] else "good").status_code == 200
    after = kto()
    assert all(after[t.trace_id] is not before[t.trace_id] for t in flipped)
    assert {k: v for k, v in after.items() if k not in {t.trace_id for t in flipped}} == {
        k: v for k, v in before.items() if k not in {t.trace_id for t in flipped}
    }


def test_without_the_extra_the_command_prints_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn raises ImportError
    assert main(["review", "--store", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == "flowrl review needs the review extra: pip install 'flowrl[review]'"


def test_import_flowrl_stays_light() -> None:
    code = "import sys, flowrl, flowrl.cli; bad = {'starlette', 'jinja2', 'uvicorn'} & set(sys.modules); print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "set()"


def test_the_page_counts_the_tool_calls_the_rewards_read() -> None:
    """Issue 39: "tool calls 1" for a run whose transcript shows 3 calls and whose tool_success counted 2: the
    count read only the `tool_calls` field. It now counts `flowrl.trace.facts.tool_calls` (final_answer left out)."""
    from flowrl.review.view import numbers
    from flowrl.rewards.tool_success import ToolSuccessReward
    from flowrl.trace.schema import ToolCallTrace

    def call(i: int, name: str, args: str) -> dict[str, Any]:
        return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}

    messages = [
        {"role": "user", "content": "What is 12 * 7 + 1?"},
        {"role": "assistant", "content": "", "tool_calls": [call(1, "exec_code", '{"code": "print(12*7)"}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "84"},
        {"role": "assistant", "content": "", "tool_calls": [call(2, "exec_code", '{"code": "print(84+1)"}')]},
        {"role": "tool", "tool_call_id": "c2", "content": "85"},
        {"role": "assistant", "content": "", "tool_calls": [call(3, "final_answer", '{"answer": "85"}')]},
        {"role": "tool", "tool_call_id": "c3", "content": "85"},
    ]
    trace = ExecutionTrace(
        user_query="What is 12 * 7 + 1?",
        messages=messages,
        tool_calls=[ToolCallTrace(tool_name="exec_code", arguments={"code": "print(12*7)"}, result="84", call_id="c1")],
        final_response="85",
    )
    assert dict(numbers(trace))["tool calls"] == "2"
    assert ToolSuccessReward().score(trace).details["calls"] == 2  # what the reward counted


def test_a_host_that_is_no_address_of_this_machine_is_blamed_not_the_port(tmp_path: Path, capsys: Any) -> None:
    """Issue 39: `flowrl review --host 999.1.1.1` said "pick another --port"."""
    (tmp_path / "store").mkdir()
    assert main(["review", "--host", "999.1.1.1", "--store", str(tmp_path / "store")]) != 0
    err = capsys.readouterr().err
    assert "--host" in err.splitlines()[-1] and "--port" not in err.splitlines()[-1]
