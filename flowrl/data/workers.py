"""Processes that make a columnar KTO build's rows beside the pipeline's process (`flowrl build --workers N`).

The pipeline's process lists the store, reads each segment's small columns and decides every trace and row
(filters, dedupe, labels, splits, lengths, shuffle buckets and sequence numbers: `flowrl.data.columnar_kto.plan`
and `DiskSink.assign`); a worker reads the segment's message column, makes the rows' Arrow and JSON text
(`materialize`) and spools them (`flowrl.data.spools`). Then the finish is shared out: each worker writes a run
of buckets of a split. What is written does not depend on which worker did what: a bucket's rows are put back in
their sequence order before its permutation, so the files are those of a build in one process, byte for byte.

Workers are started with `spawn` (a fork of a process that has run Arrow's thread pools can hang); they import
pyarrow and the segment reader, not `datasets`. A worker that fails says why on the reply queue and the build
stops with that line; one that dies is noticed within a second.
"""

from __future__ import annotations

import logging
import os
import queue
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.data.columnar_kto import materialize
from flowrl.data.spools import SpoolSet, finish_part
from flowrl.errors import FlowRLError
from flowrl.store.segments.format import Segment
from flowrl.store.segments.fs import Root

log = logging.getLogger(__name__)

HEAVY = ["conv_messages", "conv_tools"]


class WorkerError(FlowRLError):
    """A worker process failed."""


@dataclass
class SegmentTask:
    """Rows of one segment to make and spool: where the segment is, the plan, and each row's key and sequence."""

    path: str
    location: str
    plan: Any  # flowrl.data.columnar_kto.Plan
    names: list[str]
    keys: Any
    seq: Any


class Workers:
    """`n` worker processes reading segments under `root_url`, spooling into `tmp/w{k}`."""

    def __init__(self, n: int, root_url: str, schema: Any, tmp: Path) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.tasks: Any = ctx.Queue(maxsize=2 * n)  # segments, then parts to finish, shared
        self.replies: Any = ctx.Queue()
        self.go = [ctx.Queue() for _ in range(n)]  # each worker's: finish after its spools are closed
        self.procs = [
            ctx.Process(
                target=_main,
                args=(k, root_url, schema, str(tmp / f"w{k}"), self.tasks, self.go[k], self.replies),
                name=f"flowrl-build-{k}",
                daemon=True,
            )
            for k in range(n)
        ]
        with _huge_pages():
            for proc in self.procs:
                proc.start()
        self.peaks: dict[int, float | None] = {}  # MiB, by worker

    def submit(self, task: Any) -> None:
        while True:
            try:
                self.tasks.put(task, timeout=1.0)
                return
            except queue.Full:
                self._check()

    def spooled(self) -> list[dict[tuple[str, int], str]]:
        """Every worker's spools, once all the segments submitted so far are spooled."""
        for _ in self.procs:
            self.submit(("close",))
        return [reply[2] for reply in self._collect("closed", len(self.procs))]

    def finish(self, parts: list[Any], on_done: Any = None) -> None:
        """Run `flowrl.data.spools.finish_part` on each part, shared out between the workers, then stop them
        (each reports its peak memory)."""
        for go in self.go:
            go.put("go")
        for part in parts:
            self.submit(("finish", part))
        for _ in self.procs:
            self.submit(("stop",))
        for reply in self._collect(("finished", "stopped"), len(parts) + len(self.procs)):
            if reply[0] == "stopped":
                self.peaks[reply[1]] = reply[2]
            elif on_done:
                on_done(reply[2])

    def terminate(self, wait: bool = True) -> None:
        for proc in self.procs:
            proc.join(timeout=5 if wait else 0)
            if proc.is_alive():
                proc.terminate()
                proc.join()

    def _collect(self, kind: str | tuple[str, ...], n: int) -> Iterator[tuple[Any, ...]]:
        """The next `n` replies, each as it comes (a failed or dead worker raises `WorkerError`)."""
        got = 0
        while got < n:
            try:
                reply = self.replies.get(timeout=1.0)
            except queue.Empty:
                self._check()
                continue
            if reply[0] == "error":
                raise WorkerError(f"build worker {reply[1]} failed: {reply[2]}")
            if reply[0] not in ((kind,) if isinstance(kind, str) else kind):
                raise WorkerError(f"build worker {reply[1]} answered {reply[0]!r} where {kind!r} was due")
            got += 1
            yield reply

    def _check(self) -> None:
        for k, proc in enumerate(self.procs):
            if not proc.is_alive() and proc.exitcode not in (0, None):
                try:  # its last words, if it had time to say them
                    reply = self.replies.get_nowait()
                    if reply[0] == "error":
                        raise WorkerError(f"build worker {reply[1]} failed: {reply[2]}")
                except queue.Empty:
                    pass
                why = "killed: out of memory?" if proc.exitcode == -9 else "its error is printed above"
                raise WorkerError(
                    f"build worker {k} exited with code {proc.exitcode} ({why}); a script that builds with "
                    "workers must start them under `if __name__ == '__main__':`, or build with workers=1"
                )


def _main(k: int, root_url: str, schema: Any, folder: str, tasks: Any, go: Any, replies: Any) -> None:
    """A worker's loop: segments to spool until a `close` (then it waits for `go`, so that each worker takes one
    `close`), then parts to finish until a `stop`."""
    try:
        import pyarrow as pa

        # malloc gives freed blocks back at once; Arrow's default (jemalloc) keeps them, which a worker that
        # makes and drops a segment's rows at a time pays for in memory
        pa.set_memory_pool(pa.system_memory_pool())
        _fixed_mmap_threshold()
        root = Root(root_url)
        spools = SpoolSet(Path(folder), schema)
        while True:
            task = tasks.get()
            if isinstance(task, SegmentTask):
                with root.open(task.path) as fh:
                    table = Segment(fh, task.location).table(HEAVY)
                spools.add_batch(task.names, task.keys, task.seq, materialize(table, task.plan, schema))
            elif task[0] == "close":
                replies.put(("closed", k, spools.close()))
                go.get()
                _trim()
            elif task[0] == "finish":
                replies.put(("finished", k, finish_part(task[1], schema)))
                _trim()
            elif task[0] == "stop":
                replies.put(("stopped", k, peak_mib()))
                return
    except BaseException as exc:  # said on the reply queue: the pipeline stops with it
        replies.put(("error", k, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None


@contextmanager
def _huge_pages() -> Iterator[None]:
    """Processes started inside have glibc's malloc ask for transparent huge pages for its large blocks (the
    `glibc.malloc.hugetlb` tunable, read when a process starts; other C libraries ignore it): a worker's buffers
    are fresh pages every segment and bucket, and faulting them in 4 KiB at a time was a tenth of its time."""
    before = os.environ.get("GLIBC_TUNABLES")
    os.environ["GLIBC_TUNABLES"] = ":".join(filter(None, [before, "glibc.malloc.hugetlb=1"]))
    try:
        yield
    finally:
        if before is None:
            del os.environ["GLIBC_TUNABLES"]
        else:
            os.environ["GLIBC_TUNABLES"] = before


def _fixed_mmap_threshold() -> None:
    """glibc: blocks of 128 KiB and more from mmap, always. Its default raises that threshold to the largest block
    freed so far, after which a bucket's buffers come from the heap and what they leave behind is not given back."""
    _glibc("mallopt", -3, 128 * 1024)  # M_MMAP_THRESHOLD


def _trim() -> None:
    """glibc: give the heap's free memory back (what the segments' many small buffers, or a finished part, left
    behind) before the next part of the finish takes its buckets."""
    _glibc("malloc_trim", 0)


def _glibc(function: str, *args: int) -> None:
    """Call a glibc allocator function; elsewhere (not glibc) the allocator keeps its own policy."""
    import ctypes
    import ctypes.util

    try:
        getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), function)(*args)
    except (OSError, AttributeError):
        pass


def peak_mib() -> float | None:
    """This process's own peak resident memory in MiB: `VmHWM` where Linux gives it (kept per address space, so
    it starts afresh at exec), else `ru_maxrss`, which Linux keeps across exec: a child forked from a big process
    reports the parent's size there. None where neither is known."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
