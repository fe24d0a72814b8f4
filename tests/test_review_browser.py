"""`flowrl review` in a real browser: the real app under uvicorn, driven by Playwright through the system Chromium.

Labels 20 runs with the keyboard (timed), checks them on disk with a fresh store, and opens a hostile trace:
no dialog may fire, no script of the trace may run, and no request may leave 127.0.0.1. The hostile page is
screenshotted to `$FLOWRL_TEST_ARTIFACTS/review.png` (default `test-artifacts/`)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the review extra is not installed: pip install 'flowrl[review]'")
uvicorn = pytest.importorskip("uvicorn", reason="the review extra is not installed: pip install 'flowrl[review]'")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: pip install playwright")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH: install the system Chromium to run the browser tests", allow_module_level=True)

from test_review import hostile_trace  # noqa: E402

from flowrl.cli.review import _bind  # noqa: E402
from flowrl.data.synthetic import synthetic_trace  # noqa: E402
from flowrl.review.app import create_app  # noqa: E402
from flowrl.store.files import TraceStore  # noqa: E402

N_LABELS = 20


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("review") / "traces"
    store = TraceStore(root)
    traces = [synthetic_trace(i, n_tasks=40) for i in range(30)]
    store.write_many([*traces, hostile_trace()])
    sock = _bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(store), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", root, {t.trace_id: t for t in traces}
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def watched_page(browser: Any, base: str) -> tuple[Any, list[str], list[str]]:
    """A new page, and the dialogs it opens and the requests it sends to anywhere but `base`."""
    page = browser.new_page()
    dialogs: list[str] = []
    outside: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("request", lambda r: None if r.url.startswith(base + "/") else outside.append(r.url))
    return page, dialogs, outside


def current(page: Any) -> str:
    return str(page.evaluate("document.body.dataset.traceId"))


def press(page: Any, key: str) -> None:
    with page.expect_navigation():
        page.keyboard.press(key)


def test_label_twenty_runs_with_the_keyboard(served: tuple[str, Path, dict[str, Any]], browser: Any) -> None:
    base, root, traces = served
    page, dialogs, outside = watched_page(browser, base)
    page.goto(base + "/")
    press(page, "n")  # the queue's first run
    first = current(page)
    press(page, "n")
    second = current(page)
    press(page, "p")
    assert current(page) == first != second
    press(page, "s")  # skip: no label, the next run
    assert current(page) == second and TraceStore(root).get(first).label_source == "engine"

    page.keyboard.press("e")  # notes first, then the label carries them
    page.keyboard.type("checked by hand")
    page.keyboard.press("Escape")
    given: dict[str, bool] = {}
    started = time.monotonic()
    for i in range(N_LABELS):
        trace_id = current(page)
        good = bool(traces[trace_id].success) if i % 5 else not traces[trace_id].success  # some against the engine
        press(page, "g" if good else "b")
        given[trace_id] = good
    took = time.monotonic() - started
    print(f"labelled {N_LABELS} runs with the keyboard in {took:.1f} s")
    assert took < 120
    assert len(given) == N_LABELS
    assert "labelled today: " + str(N_LABELS) in page.inner_text("#counter").replace("\n", " ")

    fresh = TraceStore(root)  # what is on disk
    for trace_id, good in given.items():
        t = fresh.get(trace_id)
        assert (t.label, t.label_source, t.manual_review) == (good, "manual", True), trace_id
    assert fresh.get(second).review_notes == "checked by hand"
    assert not dialogs and not outside


def test_hostile_trace_stays_text(served: tuple[str, Path, dict[str, Any]], browser: Any) -> None:
    base, _, _ = served
    page, dialogs, outside = watched_page(browser, base)
    page.goto(base + "/t/hostile1")
    page.wait_for_load_state("networkidle")
    for details in page.query_selector_all("details"):
        details.evaluate("d => d.open = true")
    page.mouse.click(5, 5)
    assert page.inner_text("#trace-id") == "hostile1"
    assert "<img src=x onerror=alert(1)>" in page.inner_text("body")
    assert "![x](http://evil/beacon.png)" in page.inner_text("body")
    assert page.evaluate("document.querySelectorAll('img, iframe, svg, object, embed').length") == 0
    assert page.evaluate("Array.from(document.scripts).map(s => s.getAttribute('src'))") == ["/static/review.js"]
    assert page.evaluate("Array.from(document.links).every(a => a.href.startsWith(location.origin))")
    folder = Path(os.environ.get("FLOWRL_TEST_ARTIFACTS", "test-artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / "review.png"), full_page=True)
    page.goto(base + "/")  # the queue lists it too (its agent name is a script tag)
    page.wait_for_load_state("networkidle")
    assert dialogs == [], f"a dialog fired: {dialogs}"
    assert outside == [], f"requests left 127.0.0.1: {outside}"
