"""The served policy follows promotions.jsonl (issue 38): a promotion or a rollback switches the model behind the
served name with no request dropped under concurrent load, requests in flight finish on the model they started
on, and the replaced engine stops only when it answers nothing; a model that cannot load leaves the current one
serving, said and counted."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flowrl.engines.chat_backend import TokensInBackend
from flowrl.promote.follow import Follower
from flowrl.promote.history import Entry, History
from flowrl.serve.model import Route, ServedModel
from flowrl.serve.server import start
from tests.helpers_export import tiny_tokenizer

TEMPLATE = (Path(__file__).parent.parent / "flowrl" / "templates" / "smollm2_chatml.jinja").read_text()
TOKENIZER = tiny_tokenizer(TEMPLATE)


class LabelBackend(TokensInBackend):
    """A model that answers its label after `delay` seconds (or when `gate` opens); it fails any call after its
    engine was stopped, and records how many calls it was answering when it was stopped."""

    def __init__(self, label: str, delay: float = 0.0, gate: threading.Event | None = None) -> None:
        super().__init__(".", tokenizer=TOKENIZER, temperature=0.0)
        self.label, self.delay, self.gate = label, delay, gate
        self.ids = TOKENIZER.encode(label, add_special_tokens=False) + [TOKENIZER.eos_token_id]
        self.active = 0
        self.calls = 0
        self.stopped_with: int | None = None
        self._lock = threading.Lock()

    def _generate(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        with self._lock:
            if self.stopped_with is not None:
                raise RuntimeError(f"{self.label}: called after its engine stopped")
            self.active += 1
            self.calls += 1
        try:
            if self.gate is not None:
                self.gate.wait(30)
            time.sleep(self.delay)
            return list(self.ids), [-0.1] * len(self.ids)
        finally:
            with self._lock:
                self.active -= 1

    def stop(self) -> None:
        with self._lock:
            self.stopped_with = self.active


def _opened(backends: list[LabelBackend], delay: float = 0.0) -> Callable[[Path | None], Any]:
    """A `load` for the follower: each model a new engine labelled by the adapter's folder name."""

    def load(adapter: Path | None) -> tuple[Route, Callable[[], None]]:
        if adapter is not None and adapter.name == "broken":
            raise RuntimeError("adapter_model.safetensors is damaged")
        backend = LabelBackend(adapter.name if adapter else "base", delay=delay)
        backends.append(backend)
        return Route(backend), backend.stop

    return load


def _ask(url: str) -> tuple[int, str]:
    body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.02)


@pytest.fixture
def serving(tmp_path: Path) -> Any:
    base = LabelBackend("base", delay=0.01)
    served = ServedModel(base, name="policy")
    server, _ = start(served, port=0)
    yield served, base, server.url
    server.shutdown()
    server.server_close()


def test_a_promotion_and_a_rollback_switch_the_served_model_with_no_request_dropped_under_load(
    serving: Any, tmp_path: Path
) -> None:
    served, base, url = serving
    history = History(tmp_path / "promotions.jsonl")
    engines: list[LabelBackend] = [base]
    follower = Follower(
        served, history, _opened(engines, delay=0.01), serving=None, close_current=base.stop, poll=0.02
    ).start()
    replies: list[tuple[int, str]] = []
    done = threading.Event()

    def client() -> None:
        while not done.is_set():
            replies.append(_ask(url))

    clients = [threading.Thread(target=client) for _ in range(8)]
    try:
        for thread in clients:
            thread.start()
        _wait(lambda: len(replies) >= 40)
        history.append(Entry("promote", candidate=str(tmp_path / "round-1"), replaced=None))
        _wait(lambda: any(text == "round-1" for _, text in replies[-8:]))
        seen = len(replies)
        _wait(lambda: len(replies) >= seen + 40)
        history.rollback()
        _wait(lambda: follower.serving is None and len(follower.switches) == 2)
        seen = len(replies)
        _wait(lambda: len(replies) >= seen + 40)
    finally:
        done.set()
        for thread in clients:
            thread.join()
        follower.stop()

    assert [status for status, _ in replies if status != 200] == []  # none dropped, none sent to a stopped engine
    labels = [text for _, text in replies]
    first_new = labels.index("round-1")
    assert set(labels[:first_new]) == {"base"} and labels[-1] == "base"
    assert [e.label for e in engines] == ["base", "round-1", "base"]  # the base again after the rollback
    assert [e.stopped_with for e in engines] == [0, 0, 0]  # each engine stopped with no call in flight, all stopped
    assert all(e.calls > 0 for e in engines)
    assert [(s["from"], s["to"]) for s in follower.switches] == [
        (None, str(tmp_path / "round-1")),
        (str(tmp_path / "round-1"), None),
    ]
    assert follower.failures == 0


def test_a_request_in_flight_finishes_on_the_model_it_started_on(tmp_path: Path) -> None:
    gate = threading.Event()
    old = LabelBackend("old", gate=gate)
    served = ServedModel(old, name="policy")
    new = LabelBackend("new")
    request = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    first: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: first.update(served.complete(request)))
    thread.start()
    _wait(lambda: old.active == 1)

    replaced = served.switch("policy", Route(new))
    assert served.complete(request)["choices"][0]["message"]["content"] == "new"  # the next request: the new model
    assert served.in_flight(replaced) == 1 and not served.drain(replaced, timeout=0.05)
    gate.set()
    assert served.drain(replaced, timeout=30)
    thread.join()
    assert first["choices"][0]["message"]["content"] == "old"


def test_a_promoted_model_that_cannot_load_leaves_the_current_one_serving_said_and_counted(
    serving: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served, base, url = serving
    history = History(tmp_path / "promotions.jsonl")
    follower = Follower(served, history, _opened([]), serving=None, close_current=base.stop, poll=60)
    history.append(Entry("promote", candidate=str(tmp_path / "broken"), replaced=None))
    with caplog.at_level("WARNING", logger="flowrl.promote.follow"):
        assert not follower.check()
        assert not follower.check()  # the file did not change: not tried again
    assert follower.failures == 1 and follower.serving is None
    assert "cannot load" in caplog.text and "still serving the base model" in caplog.text
    assert _ask(url) == (200, "base") and base.stopped_with is None

    (tmp_path / "promotions.jsonl").write_text("not json\n")  # a damaged record: the policy keeps serving
    assert not follower.check()
    assert follower.failures == 2 and _ask(url) == (200, "base")
