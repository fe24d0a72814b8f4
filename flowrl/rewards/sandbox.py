"""The code sandbox: the only place flowrl runs code an agent wrote.

A pool of warm worker processes ("zygotes", one per core by default). Each zygote is a clean
`python -I -S` started with `subprocess` (no inherited fds, no host environment, no site-packages)
inside the strongest isolation that works here. At start-up, before any job exists, it forks a fork
server; every job is a fork of that pristine copy, so no job's code, output or leftovers are in the
memory another job starts from. The isolation in use is the `isolation` attribute and is logged when
the pool starts; it is never weakened silently.

Isolation levels, strongest first:

* ``"bwrap"`` (bubblewrap): the zygote runs in new network, PID, IPC, UTS (and, when not root, user)
  namespaces on a root file system of its own: /usr, /etc, /sys, the /bin and /lib links, the Python
  installation and `python_path`, all read-only, a minimal read-only /dev, a private /tmp and
  /dev/shm, and nothing else of the host (no /var, /run, /home, /root, /srv, /opt, project folders),
  so no host unix socket outside those directories is there to connect to.
* ``"unshare"`` (util-linux): the same namespaces and root, built by `unshare`, `mount` and
  `pivot_root` (used when bwrap is missing or broken).
* ``"rlimits"``: no namespaces at all; only the per-job limits below. Loudly logged; refuse it with
  ``require_isolation="bwrap"`` (or ``"unshare"``), or ``FLOWRL_SANDBOX_REQUIRE=bwrap``.

Per job, at every level: a new session (the whole process group is killed at the end), wall-clock
timeout, RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0, RLIMIT_NPROC,
RLIMIT_MSGQUEUE=0 (no POSIX message queues), no_new_privs, a seccomp filter that refuses the kernel
keyrings (shared by every process of a uid), stdin on /dev/null, stdout/stderr captured up to
`max_output` bytes each, a fresh temporary working directory, an environment of PATH, HOME=/tmp, LANG
and TMPDIR only. When flowrl runs as root, each job drops to uid/gid 65534 (`nobody`); inside a user
namespace without a uid to drop to, it drops every capability. The zygote and the fork server are not
dumpable, so a job cannot open their pipes (to read the next job or forge a result) or ptrace them.
With a PID namespace the zygote is the namespace's init: a job cannot kill it, and everything a job
leaves behind is killed when it ends. Between two jobs of a worker (bwrap, unshare) its /tmp and
/dev/shm are emptied and every System V IPC object is removed; a worker that cannot be cleaned is
retired, never reused.

What is NOT isolated: /usr, /etc and /sys are readable (add paths to `hide_paths`); the seccomp filter
covers only the keyrings, so the rest of the kernel syscall surface is reachable (a kernel exploit
escapes); CPU and memory are limited per process, not per job (no cgroups), and jobs running at the
same moment share their uid's process budget; jobs see the host's CPU count and /sys; with
``"rlimits"`` there is no network, PID, IPC or mount isolation at all (a job can use the network and
the host's unix sockets, write wherever its uid may, leave System V IPC objects for later jobs, and
signal or ptrace other processes of its uid: when flowrl is not root, that is flowrl itself). This is
a guard against accidents and ordinary hostile snippets, not a boundary against an attacker with a
kernel exploit.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import shutil
import sys
import threading
import weakref
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flowrl.errors import SandboxError
from flowrl.rewards.sandbox_launch import LEVELS, Launch, Worker, WorkerDied, build_launch, check_facts

log = logging.getLogger(__name__)

STATUSES = ("ok", "error", "timeout", "oom", "killed", "infra_error")
LANGUAGES = {"python": "python", "py": "python", "python3": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
DEFAULT_PRELOAD = ("json", "math", "re", "collections", "itertools", "functools", "random", "string", "datetime")
_WORKER_SOURCE = Path(__file__).with_name("sandbox_worker.py")
# A job queued behind a running one waits in the worker's pipe, unread (a pipe holds 64 KiB): a bigger
# one is sent only to an idle worker, which reads it at once.
_PIPELINE_MAX_CODE = 16 * 1024


@dataclass
class ExecResult:
    """What one snippet did. `status` is one of STATUSES; only "infra_error" means the sandbox failed."""

    status: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    language: str = "python"
    cpu_time: float | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    reason: str | None = None
    error: str | None = None
    isolation: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Job:
    code: str
    language: str = "python"
    timeout: float | None = None


def _as_job(job: Job | str | tuple | dict) -> Job:
    if isinstance(job, Job):
        return job
    if isinstance(job, str):
        return Job(job)
    if isinstance(job, tuple):
        return Job(*job)
    if isinstance(job, dict):
        return Job(job["code"], job.get("language", "python"), job.get("timeout"))
    raise TypeError(
        f"a sandbox job is a Job, code string, (code, language[, timeout]) or dict, not {type(job).__name__}"
    )


class _State:
    """Everything the finalizer needs, kept apart from Sandbox so the Sandbox itself can be collected."""

    def __init__(self) -> None:
        self.slots: list[Worker] = []
        self.spawner = ThreadPoolExecutor(1, thread_name_prefix="flowrl-sandbox-spawner")
        self.executor: ThreadPoolExecutor | None = None
        self.closed = False
        self.owner = os.getpid()

    def shutdown(self) -> None:
        self.closed = True
        if os.getpid() != self.owner:  # a forked copy of the host: the workers are the parent's
            return
        for slot in self.slots:  # first the workers: a job running now ends as infra_error
            try:
                slot.stop(grace=0.2)
            except Exception:  # pragma: no cover - best effort at exit
                log.debug("flowrl sandbox: stopping a worker failed", exc_info=True)
        if self.executor is not None:
            in_pool = threading.current_thread().name.startswith("flowrl-sandbox")
            self.executor.shutdown(wait=not in_pool, cancel_futures=True)
        self.spawner.shutdown(wait=False)


class Sandbox:
    """A pool of isolated workers that run Python and bash snippets. Thread-safe.

    `run(code, language, timeout=)` runs one snippet; `run_many(jobs)` runs many across the pool.
    Use it as a context manager or call `close()`; it is also closed at interpreter exit.
    """

    def __init__(  # noqa: PLR0913  # keyword-only: the sandbox's limits, each a TOML option
        self,
        workers: int | None = None,
        *,
        isolation: str = "auto",
        require_isolation: str | None = None,
        timeout: float = 5.0,
        memory_mb: int | None = 1024,
        cpu_time: float | None = None,
        max_output: int = 64 * 1024,
        kill_output_over: int = 16 * 1024 * 1024,
        max_file_size: int = 16 * 1024 * 1024,
        max_open_files: int = 256,
        max_procs: int = 64,
        recycle_after: int = 1000,
        drop_uid: int | None = 65534,
        preload: Iterable[str] = DEFAULT_PRELOAD,
        python_path: Iterable[str] = (),
        hide_paths: Iterable[str] = ("/root", "/home", "/run"),
        python: str | None = None,
        start_timeout: float = 15.0,
    ) -> None:
        if isolation != "auto" and isolation not in LEVELS:
            raise SandboxError(f"isolation={isolation!r}: use 'auto' or one of {', '.join(LEVELS)}")
        require = require_isolation or os.environ.get("FLOWRL_SANDBOX_REQUIRE") or None
        if require is not None and require not in LEVELS:
            raise SandboxError(f"require_isolation={require!r}: use one of {', '.join(LEVELS)}")
        self.workers = max(1, workers or len(os.sched_getaffinity(0)))
        self.requested_isolation = isolation
        self.require_isolation = require
        self.timeout = timeout
        self.recycle_after = recycle_after
        self.start_timeout = start_timeout
        self.python = os.path.realpath(python or sys.executable)
        self.python_path = tuple(python_path)
        self.hide_paths = tuple(hide_paths)
        is_root = os.geteuid() == 0
        self.drop_uid = drop_uid if is_root else None
        if is_root and drop_uid is None:
            log.warning("flowrl sandbox: running as root with drop_uid=None: jobs run as uid 0 without capabilities")
        self.config: dict[str, Any] = {
            "timeout": timeout,
            "cpu_time": cpu_time,
            "memory_bytes": memory_mb * 1024 * 1024 if memory_mb else None,
            "max_output": max_output,
            "output_kill": kill_output_over,
            "max_file_size": max_file_size,
            "max_open_files": max_open_files,
            "nproc": _nproc_limit(self.drop_uid if self.drop_uid is not None else os.getuid(), max_procs)
            if max_procs
            else None,
            "drop_uid": self.drop_uid,
            "drop_gid": self.drop_uid,
            "preload": list(preload),
            "sys_path": list(self.python_path),
            "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"},
            "bash": shutil.which("bash") or "/bin/sh",
        }
        self._isolation: str | None = None
        self._launch: Launch | None = None
        self._lock = threading.Lock()
        self._idle: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        self._state = _State()
        self._finalizer = weakref.finalize(self, _State.shutdown, self._state)

    # -- lifecycle ------------------------------------------------------------------------------------
    @property
    def isolation(self) -> str:
        """The isolation in use: "bwrap", "unshare" or "rlimits" (starts the pool if needed)."""
        if self._isolation is None:
            self.start()
        assert self._isolation is not None
        return self._isolation

    def start(self) -> Sandbox:
        """Start the pool now (otherwise it starts on first use). Raises SandboxError when no allowed
        isolation level works."""
        with self._lock:
            if self._state.closed:
                raise SandboxError("the sandbox is closed: create a new Sandbox")
            if os.getpid() != self._state.owner:
                raise SandboxError("this Sandbox belongs to the process that created it: create one after fork")
            if self._isolation is None:
                self._choose_isolation()
        return self

    def close(self) -> None:
        """Stop every worker. Safe to call twice."""
        self._finalizer()

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _choose_isolation(self) -> None:
        candidates = list(reversed(LEVELS)) if self.requested_isolation == "auto" else [self.requested_isolation]
        if self.require_isolation is not None:
            floor = LEVELS.index(self.require_isolation)
            candidates = [c for c in candidates if LEVELS.index(c) >= floor]
        failures: list[str] = []
        for level in candidates:
            try:
                launch = build_launch(
                    level, self.python, _WORKER_SOURCE.read_text(), self._keep_paths(), self.hide_paths
                )
                config = dict(self.config, **launch.config)
                zygote = Worker(launch, config, self._state.spawner, self.start_timeout)
                facts = self._start_zygote(zygote)
                problem = check_facts(launch, facts)
                if problem:
                    zygote.stop()
                    raise WorkerDied(problem)
                if launch.config.get("own_pid_ns") and not facts.get("job_pid_ns"):
                    log.warning(
                        "flowrl sandbox: %s could not give the jobs a PID namespace of their own (no CAP_SYS_ADMIN "
                        "there), so a job sees the worker's processes and, as the same uid, can signal them",
                        level,
                    )
                if not facts.get("seccomp"):
                    log.warning(
                        "flowrl sandbox: this kernel refused a seccomp filter, so jobs can use the kernel keyrings "
                        "(keyctl), which every job of the same uid shares"
                    )
            except (WorkerDied, OSError) as exc:
                failures.append(f"{level}: {exc}")
                log.info("flowrl sandbox: %s isolation does not work here: %s", level, exc)
                continue
            self._isolation, self._launch = level, launch
            self._state.slots.append(zygote)
            self._idle.put(zygote)
            for _ in range(self.workers - 1):  # the others start on first use, in parallel
                slot = Worker(launch, config, self._state.spawner, self.start_timeout)
                self._state.slots.append(slot)
                self._idle.put(slot)
            self._announce(level, failures)
            if level == "rlimits" and self.drop_uid is not None:
                self._check_readable_by_jobs()
            return
        wanted = f"at least {self.require_isolation!r}" if self.require_isolation else repr(self.requested_isolation)
        raise SandboxError(
            f"no sandbox isolation level ({wanted}) works here: {'; '.join(failures) or 'none allowed'}. "
            "Install bubblewrap (`apt-get install bubblewrap`) and check that user namespaces are enabled."
        )

    def _announce(self, level: str, failures: list[str]) -> None:
        why = f" ({'; '.join(failures)})" if failures else ""
        chosen = "as requested" if self.requested_isolation == level else f"bubblewrap unavailable{why}"
        if level == "bwrap":
            log.info("flowrl sandbox: isolation 'bwrap' with %d workers", self.workers)
        elif level == "unshare":
            log.warning(
                "flowrl sandbox: isolation 'unshare' (%s): namespaces and mounts built by hand. Install "
                "bubblewrap (apt-get install bubblewrap) for the tested setup.",
                chosen,
            )
        else:
            log.warning(
                "flowrl sandbox: NO NAMESPACE ISOLATION, isolation 'rlimits' (%s): jobs can use the network, "
                "write wherever uid %s may and signal its processes. Install bubblewrap (apt-get install "
                "bubblewrap) or pass require_isolation='bwrap' to refuse.",
                "as requested" if self.requested_isolation == level else f"no namespaces available{why}",
                self.drop_uid if self.drop_uid is not None else os.getuid(),
            )

    def _check_readable_by_jobs(self) -> None:
        """Without our own mounts, jobs (uid `drop_uid`) see the host's permissions: a Python installed
        in /root cannot be read by them, so they can import only what the worker preloaded."""
        for path in self._keep_paths():
            dirs: list[str | Path] = [path, *Path(path).parents]
            blocked = next((p for p in dirs if not os.stat(p).st_mode & 0o001), None)
            if blocked is not None:
                log.warning(
                    "flowrl sandbox: uid %s cannot enter %s, so jobs cannot read %s and can import only the "
                    "preloaded modules. Use bwrap/unshare isolation or a Python installed outside it.",
                    self.drop_uid,
                    blocked,
                    path,
                )
                return

    def _keep_paths(self) -> list[str]:
        prefix = os.path.realpath(sys.base_prefix)
        return [prefix, os.path.dirname(self.python), *[os.path.realpath(p) for p in self.python_path]]

    def _start_zygote(self, zygote: Worker) -> dict[str, Any]:
        try:
            return zygote.start()
        except (WorkerDied, OSError) as exc:
            tail = zygote.stderr_tail()
            zygote.stop(grace=0.1)
            raise WorkerDied(f"{exc}{': ' + tail if tail else ''}") from exc

    # -- running ----------------------------------------------------------------------------------
    def run(self, code: str, language: str = "python", timeout: float | None = None) -> ExecResult:
        """Run one snippet in a worker; blocks until it finishes. Never raises for what the code does;
        a sandbox failure comes back as status "infra_error"."""
        return self.run_many([Job(code, language, timeout)])[0]

    def run_many(self, jobs: Iterable[Job | str | tuple | dict]) -> list[ExecResult]:
        """Run many snippets across the pool; results in the order of `jobs`."""
        items = [self._job(j) for j in jobs]
        if not items:
            return []
        self.start()
        results: list[ExecResult | None] = [None] * len(items)
        pending = collections.deque(enumerate(items))
        lock = threading.Lock()
        drivers = min(self.workers, len(items))
        if drivers == 1:
            self._drive(pending, lock, results)
        else:
            with self._lock:
                if self._state.executor is None:
                    self._state.executor = ThreadPoolExecutor(self.workers, thread_name_prefix="flowrl-sandbox")
                executor = self._state.executor
            for future in [executor.submit(self._drive, pending, lock, results) for _ in range(drivers)]:
                future.result()
        return [r if r is not None else self._failed(j, "not run") for r, j in zip(results, items)]

    def _job(self, job: Job | str | tuple | dict) -> Job:
        job = _as_job(job)
        language = LANGUAGES.get(str(job.language).lower())
        if language is None:
            raise ValueError(f"language {job.language!r} is not supported: use one of {', '.join(sorted(LANGUAGES))}")
        timeout = float(job.timeout if job.timeout is not None else self.timeout)
        code = job.code.encode("utf-8", "replace").decode("utf-8")  # lone surrogates cannot cross the pipe
        return Job(code, language, timeout)

    def _drive(self, pending: collections.deque, lock: threading.Lock, results: list) -> None:
        """Feed one worker from `pending` until it is empty. Two jobs are kept at the worker, so it
        starts the next the moment one ends instead of waiting for this thread to be scheduled."""
        slot = self._idle.get()
        inflight: collections.deque[tuple[int, Job]] = collections.deque()
        try:
            while True:
                while len(inflight) < 2 and slot.next_id < self.recycle_after:
                    with lock:
                        if not pending:
                            break
                        # a second job only when there is enough for every worker, and a small one
                        if inflight and (len(pending) <= self.workers or _too_big_to_queue(pending[0][1].code)):
                            break
                        index, job = pending.popleft()
                    if self._state.closed:
                        problem: str | None = "the sandbox is closed"
                    else:
                        problem = None if inflight else self._ensure_running(slot)
                    if problem is None:
                        try:
                            slot.submit(job.code, job.language, job.timeout)
                            inflight.append((index, job))
                            continue
                        except WorkerDied as exc:
                            problem = self._lost(slot, exc, pending, lock, inflight)
                    results[index] = self._failed(job, problem)
                if not inflight:
                    return
                index, job = inflight.popleft()
                try:
                    reply = slot.collect()
                except (WorkerDied, OSError, ValueError) as exc:
                    results[index] = self._failed(job, self._lost(slot, exc, pending, lock, inflight))
                    continue
                results[index] = self._result(reply, job)
                if reply.get("retire"):  # it could not clean up after this job: no job may run there again
                    why = reply.get("reason") or reply.get("error") or "it could not clean up after the job"
                    log.warning("flowrl sandbox: retiring a worker after a job: %s", why)
                    with lock:
                        pending.extendleft(reversed(inflight))
                    inflight.clear()
                    slot.stop()
                elif not inflight and slot.jobs >= self.recycle_after:
                    slot.stop()  # a fresh worker for the next job
        finally:
            self._idle.put(slot)

    def _ensure_running(self, slot: Worker) -> str | None:
        """Start the slot's worker if it is not running; the problem when that fails."""
        if self._state.closed:
            return "the sandbox is closed"
        if slot.alive():
            return None
        if slot.proc is not None:
            log.warning("flowrl sandbox: a worker died (%s); starting a new one", slot.stderr_tail() or "no message")
            slot.stop(grace=0.1)
        try:
            self._start_zygote(slot)
        except WorkerDied as exc:
            log.error("flowrl sandbox: cannot start a %s worker: %s", self._isolation, exc)
            return f"worker start failed: {exc}"
        return None

    def _lost(self, slot: Worker, exc: Exception, pending: collections.deque, lock: threading.Lock, inflight) -> str:
        """The worker failed: stop it, and give the jobs it had not started back to the queue."""
        log.warning("flowrl sandbox: worker failed during a job: %s %s", exc, slot.stderr_tail())
        slot.stop(grace=0.1)
        with lock:
            pending.extendleft(reversed(inflight))
        inflight.clear()
        return f"worker failed: {exc}"

    def _failed(self, job: Job, error: str) -> ExecResult:
        return ExecResult("infra_error", language=job.language, error=error, isolation=self._isolation)

    def _result(self, reply: dict[str, Any], job: Job) -> ExecResult:
        fields = {k: reply[k] for k in ExecResult.__dataclass_fields__ if k in reply}
        fields.setdefault("status", "infra_error")
        fields["language"] = job.language
        fields["isolation"] = self._isolation
        return ExecResult(**fields)


def _too_big_to_queue(code: str) -> bool:
    return len(code) > _PIPELINE_MAX_CODE or len(code.encode("utf-8")) > _PIPELINE_MAX_CODE


def _nproc_limit(uid: int, budget: int) -> int:
    """RLIMIT_NPROC counts every process of the uid, system-wide: allow those that exist plus `budget`."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count + budget
