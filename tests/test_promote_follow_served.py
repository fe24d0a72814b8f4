"""`flowrl serve BASE --promotions FILE` end to end (issue 38): real engines, real adapters, clients asking all the
time; a promotion switches the served name to the adapter, a rollback back to the base, no request fails, and
Ctrl-C leaves no engine behind."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from flowrl.engines import llama_server
from flowrl.promote.history import Entry, History
from tests.helpers_export import save_tiny_adapter, save_tiny_model
from tests.test_serve_agent import _serve, _stop


def _ask(url: str, name: str) -> tuple[int, Any]:
    body = {"model": name, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0}
    request = urllib.request.Request(
        f"{url}/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, tuple(json.loads(response.read())["choices"][0]["token_ids"])
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # a dropped connection
        return 0, repr(exc)


def _until(condition: Any, seconds: float = 240) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def _llama_server_pids() -> set[int]:
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/comm"):
        try:
            if stat.read_text().strip().startswith("llama-server"):
                pids.add(int(stat.parent.name))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize("engine", ["transformers", "llama-server"])
def test_serve_follows_promotions_with_no_request_dropped(engine: str, tmp_path: Path) -> None:
    if engine == "llama-server" and not llama_server.available():
        pytest.skip(f"no llama-server binary: {llama_server.BUILD_HINT}")
    base = save_tiny_model(tmp_path / "base")
    adapter = save_tiny_adapter(base, tmp_path / "round-1")
    history = History(tmp_path / "promotions.jsonl")
    before = _llama_server_pids()
    proc, url, name = _serve(
        [str(base), "--engine", engine, "--promotions", str(history.path), "--name", "policy"], tmp_path
    )
    replies: list[tuple[int, Any]] = []
    done = threading.Event()

    def client() -> None:
        while not done.is_set():
            replies.append(_ask(url, name))

    clients = [threading.Thread(target=client) for _ in range(4)]
    try:
        base_reply = _ask(url, name)
        assert base_reply[0] == 200
        for thread in clients:
            thread.start()
        _until(lambda: len(replies) >= 8)
        history.append(Entry("promote", candidate=str(adapter), replaced=None))
        _until(lambda: any(r != base_reply for r in replies[-4:]))
        tuned = next(r for r in reversed(replies) if r != base_reply)
        seen = len(replies)
        _until(lambda: len(replies) >= seen + 8)
        history.rollback()
        _until(lambda: replies[-4:] == [base_reply] * 4)
    finally:
        done.set()
        for thread in clients:
            thread.join()
        out = _stop(proc)
    assert [r for r in replies if r[0] != 200] == [], out  # none dropped, none answered by a stopped engine
    assert tuned[0] == 200 and set(replies) == {base_reply, tuned}  # the base, then the adapter, then the base
    assert "switched models 2 time(s)" in out, out
    assert _llama_server_pids() <= before  # every engine it started stopped with it
