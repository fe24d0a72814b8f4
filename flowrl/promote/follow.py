"""The served policy follows `promotions.jsonl`: `flowrl serve BASE --promotions FILE` (issue 38).

`Follower(served, history, load)` keeps one served name answered by the model promoted now in `history`: at
start, and each time the file changes (a promotion, or a rollback), it loads the new model beside the one serving
(`load(adapter)`: a new engine; None is the base model), switches the name to it (`ServedModel.switch`: the next
request goes to the new model, the requests in flight finish on the old one), waits for them, then stops the old
engine. No request is dropped or sent to a stopped engine; for the seconds the new engine loads, both are in
memory.

A model that fails to load (a deleted folder, a damaged adapter), or a record that cannot be read, leaves the
current model serving: said once per cause in the log, counted in `failures`, tried again when the file changes.
The endpoint's users come first: a bad promotion never takes the policy down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowrl.errors import FlowRLError
from flowrl.promote.history import History
from flowrl.serve.load import nothing_to_stop
from flowrl.serve.model import Route, ServedModel

__all__ = ["Follower", "Load"]

log = logging.getLogger(__name__)

# a model to serve (an adapter folder; None: the base model) -> its route and what stops its engine
Load = Callable[[Path | None], tuple[Route, Callable[[], None]]]


class Follower:
    """See the module doc. `close_current` stops the engine serving when the follower starts; `poll`: seconds
    between looks at the file; `drain_timeout`: the longest wait for the old model's requests before its engine
    stops anyway (said and counted)."""

    def __init__(
        self,
        served: ServedModel,
        history: History,
        load: Load,
        *,
        serving: Path | None,
        close_current: Callable[[], None],
        name: str | None = None,
        poll: float = 1.0,
        drain_timeout: float = 600.0,
    ) -> None:
        self.served, self.history, self.load = served, history, load
        self.name = name or served.name
        self.serving = serving  # the model answering now (None: the base model)
        self.poll, self.drain_timeout = poll, drain_timeout
        self.switches: list[dict[str, Any]] = []  # each: from, to, load_s, drain_s, requests drained
        self.failures = 0
        self._close = close_current
        self._seen: tuple[int, int] | None = None
        self._said: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- one look ------------------------------------------------------------------------------------------------
    def check(self) -> bool:
        """Switch to the model promoted now if it is not the one serving; True when it switched."""
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        self._seen = stamp
        try:
            promoted = self.history.current()
        except FlowRLError as exc:
            self._fail(f"{exc}; still serving {self._label(self.serving)}")
            return False
        wanted = Path(promoted) if promoted else None
        if wanted == self.serving:
            return False
        started = time.perf_counter()
        try:
            route, close = self.load(wanted)
        except Exception as exc:  # the endpoint keeps serving what it serves; the cause is said once
            self._fail(f"cannot load {self._label(wanted)} ({exc}); still serving {self._label(self.serving)}")
            return False
        loaded = time.perf_counter()
        old = self.served.switch(self.name, route)
        waiting = self.served.in_flight(old)
        drained = self.served.drain(old, self.drain_timeout)
        if not drained:
            self._fail(f"requests on {self._label(self.serving)} still running after {self.drain_timeout:.0f} s")
        self._stop_engine(self._close)
        self.switches.append(
            {
                "from": None if self.serving is None else str(self.serving),
                "to": None if wanted is None else str(wanted),
                "load_s": round(loaded - started, 3),
                "drain_s": round(time.perf_counter() - loaded, 3),
                "in_flight_at_switch": waiting,
            }
        )
        log.info("%s now answered by %s (was %s)", self.name, self._label(wanted), self._label(self.serving))
        self.serving, self._close = wanted, close
        return True

    # -- the thread ----------------------------------------------------------------------------------------------
    def start(self) -> Follower:
        self.check()
        self._thread = threading.Thread(target=self._run, name="flowrl-promotions", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following and stop the engine serving now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._stop_engine(self._close)
        self._close = nothing_to_stop

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.check()
            except Exception as exc:  # never let the thread die silently: said, counted, tried again
                self._fail(f"following {self.history.path} failed ({exc!r})")

    # -- helpers -------------------------------------------------------------------------------------------------
    def _stamp(self) -> tuple[int, int]:
        try:
            st = self.history.path.stat()
        except FileNotFoundError:
            return (0, -1)
        return (st.st_mtime_ns, st.st_size)

    def _stop_engine(self, close: Callable[[], None]) -> None:
        try:
            close()
        except Exception as exc:
            self._fail(f"stopping the replaced engine failed ({exc!r})")

    def _fail(self, message: str) -> None:
        self.failures += 1
        if message not in self._said:
            self._said.add(message)
            log.warning("%s: %s", self.history.path, message)

    @staticmethod
    def _label(model: Path | None) -> str:
        return "the base model" if model is None else str(model)
