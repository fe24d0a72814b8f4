"""Starting one sandbox worker (zygote) at an isolation level, checking it, and talking to it.

`build_launch(level, ...)` gives the argv/env that starts the zygote (`sandbox_worker.py`) under
bubblewrap, under `unshare` + `mount`, or bare; `check_facts(level, facts)` compares what the started
worker reports about itself (its PID, network interfaces, whether / is writable) with what that level
promises, so a level that starts but does not isolate is rejected instead of used. `Worker` is the
host's handle on one such process: newline-delimited JSON over its stdin/stdout.
"""

from __future__ import annotations

import collections
import os
import select
import shlex
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson

LEVELS = ("rlimits", "unshare", "bwrap")  # weakest first
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}
# What the zygote needs when bwrap runs as root: set a job's uid/gid, chown its directory, kill it and
# delete what it wrote. Everything else (CAP_SYS_ADMIN, CAP_NET_*, ...) is dropped.
ROOT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER")


@dataclass
class Launch:
    level: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=lambda: dict(BASE_ENV))
    config: dict[str, Any] = field(default_factory=dict)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _rebinds(keep_paths: list[str], hidden: list[str]) -> list[str]:
    """The paths that must stay visible although a hidden directory covers them, outermost first."""
    wanted = sorted({p for p in keep_paths if p and os.path.exists(p) and any(_under(p, h) for h in hidden)})
    return [p for p in wanted if not any(q != p and _under(p, q) for q in wanted)]


def _parents_below(path: str, covers: list[str]) -> list[str]:
    """The directories between the covering (hidden) directory and `path`, outermost first."""
    root = max((c for c in covers if _under(path, c)), key=len)
    parts = path[len(root.rstrip("/")) :].strip("/").split("/")[:-1]
    return [root.rstrip("/") + "/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def build_launch(level: str, python: str, source: str, keep_paths: list[str], hide_paths: tuple[str, ...]) -> Launch:
    """argv and env that start the worker at `level`; OSError when the tool for that level is missing."""
    command = [python, "-I", "-S", "-c", source]
    hidden = [os.path.realpath(h) for h in hide_paths if os.path.isdir(h)]
    root = os.geteuid() == 0
    if level == "rlimits":
        return Launch(level, command, config={"own_pid_ns": False, "private_tmp": False, "die_with_parent": True})
    sandboxed = {"own_pid_ns": True, "private_tmp": True, "tmp_root": "/tmp"}
    if level == "bwrap":
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise OSError("bwrap is not installed (apt-get install bubblewrap)")
        argv = [bwrap]
        if root:  # no user namespace: the zygote stays real root (few caps) so jobs can drop to uid 65534
            argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
            argv += ["--cap-drop", "ALL"] + [a for cap in ROOT_CAPS for a in ("--cap-add", cap)]
        else:
            argv += ["--unshare-all"]
        argv += ["--as-pid-1", "--die-with-parent", "--new-session"]
        argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        argv += ["--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/dev/shm"]
        for path in hidden:
            argv += ["--tmpfs", path]
        covers = [*hidden, "/tmp"]
        for path in _rebinds(keep_paths, covers):
            for parent in _parents_below(path, covers):  # traversable by the job's uid (bwrap makes them 0700)
                argv += ["--perms", "0755", "--dir", parent]
            argv += ["--ro-bind", path, path]
        argv += ["--chdir", "/tmp", "--clearenv"]
        for key, value in BASE_ENV.items():
            argv += ["--setenv", key, value]
        return Launch(level, argv + command, config=sandboxed)
    if level == "unshare":
        unshare = shutil.which("unshare")
        if unshare is None or not os.path.exists("/bin/sh"):
            raise OSError("unshare (util-linux) is not installed")
        # setpriv makes unshare die with us (its --kill-child then takes the worker's namespace down).
        setpriv = shutil.which("setpriv")
        argv = [setpriv, "--pdeathsig", "KILL"] if setpriv else []
        argv += [unshare] + ([] if root else ["--map-root-user"])
        argv += ["--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts"]
        prelude = _unshare_prelude(_rebinds(keep_paths, hidden), hidden)
        return Launch(level, argv + ["/bin/sh", "-c", prelude, "flowrl-sandbox"] + command, config=sandboxed)
    raise ValueError(f"unknown isolation level {level!r}")


def _unshare_prelude(keep: list[str], hidden: list[str]) -> str:
    """A shell script run as PID 1 of the new namespaces before exec'ing the worker: what bwrap does
    with its mount options, by hand. Every existing mount goes read-only; /tmp and /dev/shm become
    private tmpfs; hidden directories become empty tmpfs; kept paths are bound back read-only."""
    q = shlex.quote
    lines = [
        "set -e",
        "umask 022",
        "cut -d' ' -f5 /proc/self/mountinfo | while read -r m; do mount -o remount,bind,ro \"$m\" 2>/dev/null || true; done",
        "mount -t tmpfs -o mode=1777 tmpfs /dev/shm",  # first a stash for the kept paths, then the job's /dev/shm
    ]
    for i, path in enumerate(keep):
        lines += [f"mkdir /dev/shm/.keep{i}", f"mount --rbind {q(path)} /dev/shm/.keep{i}"]
    lines.append("mount -t tmpfs -o mode=1777 tmpfs /tmp")
    lines += [f"mount -t tmpfs -o mode=755 tmpfs {q(path)}" for path in hidden]
    for i, path in enumerate(keep):
        lines += [
            f"mkdir -p {q(path)}",
            f"mount --move /dev/shm/.keep{i} {q(path)}",
            f"rmdir /dev/shm/.keep{i}",
            f"mount -o remount,bind,ro {q(path)}",
        ]
    lines += ["cd /tmp", 'exec "$@"']
    return "\n".join(lines)


def check_facts(level: str, facts: dict[str, Any]) -> str | None:
    """What is wrong with a started worker's isolation, or None when it is what `level` promises."""
    if level == "rlimits":
        return None
    problems = []
    if facts.get("pid") != 1:
        problems.append(f"not in its own PID namespace (pid {facts.get('pid')})")
    if facts.get("ifaces") != ["lo"]:
        problems.append(f"network interfaces visible: {facts.get('ifaces')}")
    if facts.get("root_writable"):
        problems.append("/ is writable")
    return "; ".join(problems) or None


class WorkerDied(Exception):
    """The worker process is gone or does not answer: an infrastructure failure, never the job's."""


class Worker:
    """One worker process and its pipes. Not thread-safe: the pool hands a slot to one thread at a time."""

    def __init__(self, launch: Launch, config: dict[str, Any], spawner: ThreadPoolExecutor, start_timeout: float):
        self.launch = launch
        self.config = config
        self.spawner = spawner
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr_file: Any = None
        self.scratch: str | None = None  # the job directories' parent when /tmp is shared (rlimits)
        self.buffer = b""
        self.jobs = 0  # jobs answered since the worker started
        self.next_id = 0  # jobs submitted since the worker started
        self.pending: collections.deque[tuple[int, float]] = collections.deque()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> dict[str, Any]:
        self.stderr_file = tempfile.TemporaryFile()
        config = self.config
        if not config.get("private_tmp"):  # made and removed here, so a killed worker leaves nothing
            self.scratch = tempfile.mkdtemp(prefix="flowrl-sandbox-")
            os.chmod(self.scratch, 0o711)
            config = dict(config, tmp_root=self.scratch)
        # Popen from the pool's long-lived spawner thread: bwrap's --die-with-parent (PDEATHSIG) fires
        # when the *thread* that forked it ends, so it must not be a short-lived caller thread.
        try:
            future = self.spawner.submit(
                subprocess.Popen,
                self.launch.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr_file,
                close_fds=True,
                env=self.launch.env,
                cwd="/",
                start_new_session=True,
            )
        except RuntimeError as exc:  # the pool is shutting down
            raise WorkerDied(f"cannot start a worker: {exc}") from exc
        self.proc = future.result()
        self.buffer = b""
        self.jobs = self.next_id = 0
        self.pending.clear()
        self._send({"config": config})
        facts = self._receive(time.monotonic() + self.start_timeout)
        if not facts.get("ready"):
            raise WorkerDied(f"unexpected first message {facts!r}")
        return facts

    def submit(self, code: str, language: str, timeout: float) -> None:
        """Queue a job at the worker (it runs its jobs one after another)."""
        self.next_id += 1
        self._send({"id": self.next_id, "language": language, "code": code, "timeout": timeout})
        self.pending.append((self.next_id, timeout))

    def collect(self) -> dict[str, Any]:
        """The reply to the oldest queued job. Its clock starts when the job before it ended, i.e. now at
        the latest; the worker enforces the timeout itself, this deadline is for the worker."""
        job_id, timeout = self.pending[0]
        reply = self._receive(time.monotonic() + timeout + 10.0)
        self.pending.popleft()
        self.jobs += 1
        if reply.get("id") != job_id:
            raise WorkerDied(f"reply for job {reply.get('id')!r}, expected {job_id}")
        return reply

    def run(self, code: str, language: str, timeout: float) -> dict[str, Any]:
        self.submit(code, language, timeout)
        return self.collect()

    def stop(self, grace: float = 1.0) -> None:
        proc, self.proc = self.proc, None
        self.jobs = self.next_id = 0
        self.pending.clear()
        if proc is not None:
            try:
                proc.stdin.write(b'{"cmd": "exit"}\n')  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self.stderr_file is not None:
            self.stderr_file.close()
            self.stderr_file = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def stderr_tail(self, limit: int = 2000) -> str:
        if self.stderr_file is None:
            return ""
        try:
            self.stderr_file.seek(0)
            return self.stderr_file.read()[-limit:].decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def _send(self, msg: dict[str, Any]) -> None:
        proc = self.proc
        if proc is None or proc.stdin is None:
            raise WorkerDied("the worker is not running")
        try:
            proc.stdin.write(orjson.dumps(msg) + b"\n")
            proc.stdin.flush()
        except (OSError, ValueError) as exc:  # BrokenPipeError: it died; ValueError: closed meanwhile
            raise WorkerDied(f"cannot write to the worker: {exc}") from exc

    def _receive(self, deadline: float) -> dict[str, Any]:
        proc = self.proc
        if proc is None or proc.stdout is None:
            raise WorkerDied("the worker is not running")
        try:
            fd = proc.stdout.fileno()
            while b"\n" not in self.buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WorkerDied("the worker did not answer in time")
                if not select.select([fd], [], [], remaining)[0]:
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise WorkerDied(f"the worker exited (code {proc.poll()})")
                self.buffer += chunk
        except (OSError, ValueError) as exc:  # its pipe was closed by stop() meanwhile
            raise WorkerDied(f"lost the worker: {exc}") from exc
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise WorkerDied(f"unreadable reply from the worker: {line[:200]!r}") from exc
