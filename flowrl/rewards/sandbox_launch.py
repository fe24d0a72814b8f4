"""Starting one sandbox worker (zygote) at an isolation level, checking it, and talking to it.

`build_launch(level, ...)` gives the argv/env that starts the zygote (`sandbox_worker.py`) under
bubblewrap, under `unshare` + `mount`, or bare; both namespace levels build the same root file system
from `root_layout`. `check_facts(launch, facts)` compares what the started worker reports about itself
(its PID, network interfaces, whether / is writable, what / holds) with what that level promises, so a
level that starts but does not isolate is rejected instead of used. `Worker` is the host's handle on
one such process: length-prefixed frames to its stdin (a job's code after its header), newline-delimited
JSON from its stdout.
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
# The zygote's capabilities when it runs as real root: to drop jobs to uid 65534, own their folders, kill what they
# leave, and (CAP_SYS_ADMIN) give each job its own PID and mount namespace with its own /proc. Jobs keep none.
ROOT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SYS_ADMIN")
_SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # mount, pivot_root
# What a job sees of the host's file system (bwrap, unshare): these system directories, the Python
# installation and `python_path`, read-only, and nothing else. A read-only mount does not stop
# connect() on a unix socket, so a host service listening on one elsewhere (/var/tmp, /run, /srv, a
# project folder) is out of reach only because its socket is not in the sandbox at all.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")


@dataclass
class Launch:
    level: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=lambda: dict(BASE_ENV))
    config: dict[str, Any] = field(default_factory=dict)
    root: list[str] | None = None  # what the worker must find in / (None: the host's own /)


@dataclass(frozen=True)
class Mount:
    """One step in building the sandbox's root: `kind` is "bind" (read-only), "symlink" (to `arg`),
    "tmpfs" (empty, mode `arg`; hides what is below it) or "dir" (mode 0755)."""

    kind: str
    path: str
    arg: str = ""


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def root_layout(keep_paths: list[str], hide_paths: tuple[str, ...]) -> list[Mount]:
    """The sandbox's root file system, in mount order: the system directories and the kept paths
    bound read-only, a private /tmp, hidden directories inside what is bound covered by empty tmpfs,
    kept paths under those bound back, and the directories leading to a kept path made traversable."""
    system = [p for p in SYSTEM_PATHS if os.path.lexists(p)]
    steps = [Mount("symlink", p, os.readlink(p)) for p in system if os.path.islink(p)]
    # (rank, mount), taken outer paths first; at one depth a system bind (rank 0), then a tmpfs (1),
    # then a kept path (2): a tmpfs hides part of a bind made before it, a kept path shows through it
    wanted = [(0, Mount("bind", p)) for p in system if os.path.isdir(p) and not os.path.islink(p)]
    wanted.append((1, Mount("tmpfs", "/tmp", "1777")))
    wanted += [(1, Mount("tmpfs", os.path.realpath(h), "0755")) for h in hide_paths if os.path.isdir(h)]
    wanted += [(2, Mount("bind", os.path.realpath(p))) for p in keep_paths if p and os.path.exists(p)]
    done: list[Mount] = []
    for rank, mount in sorted(set(wanted), key=lambda w: (w[1].path.rstrip("/").count("/"), w[0], w[1].path)):
        inside = max((m for m in done if _under(mount.path, m.path)), key=lambda m: len(m.path), default=None)
        if rank == 1 and mount.path != "/tmp" and (inside is None or inside.kind != "bind"):
            continue  # a hidden path nothing shows
        if rank == 2:
            if inside is not None and inside.kind == "bind":
                continue  # already visible
            base = inside.path.rstrip("/") if inside is not None else ""
            parts = mount.path[len(base) :].strip("/").split("/")[:-1]
            steps += [Mount("dir", base + "/" + "/".join(parts[: i + 1])) for i in range(len(parts))]
        done.append(mount)
        steps.append(mount)
    return steps


def _top_level(layout: list[Mount]) -> list[str]:
    return sorted({m.path.strip("/").split("/")[0] for m in layout} | {"dev", "proc", "tmp"})


def build_launch(level: str, python: str, source: str, keep_paths: list[str], hide_paths: tuple[str, ...]) -> Launch:
    """argv and env that start the worker at `level`; OSError when the tool for that level is missing."""
    command = [python, "-I", "-S", "-c", source]
    root = os.geteuid() == 0
    if level == "rlimits":
        return Launch(level, command, config={"own_pid_ns": False, "private_tmp": False, "die_with_parent": True})
    sandboxed = {"own_pid_ns": True, "own_ipc_ns": True, "private_tmp": True, "tmp_root": "/tmp"}
    layout = root_layout(keep_paths, hide_paths)
    if level == "bwrap":
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise OSError("bwrap is not installed (apt-get install bubblewrap)")
        argv = [bwrap]
        if root:  # no user namespace: the zygote stays real root (few caps) so jobs can drop to uid 65534
            argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
            argv += ["--cap-drop", "ALL"] + [a for cap in ROOT_CAPS for a in ("--cap-add", cap)]
        else:  # in the user namespace: CAP_SYS_ADMIN there, for each job's own PID namespace (jobs drop it)
            argv += ["--unshare-all", "--cap-add", "CAP_SYS_ADMIN"]
        argv += ["--as-pid-1", "--die-with-parent", "--new-session"]
        argv += ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
        for mount in layout:
            if mount.kind == "bind":
                argv += ["--ro-bind", mount.path, mount.path]
            elif mount.kind == "symlink":
                argv += ["--symlink", mount.arg, mount.path]
            elif mount.kind == "tmpfs":
                argv += ["--perms", mount.arg, "--tmpfs", mount.path]
            else:  # bwrap would make it 0700: the job's uid could not pass through it
                argv += ["--perms", "0755", "--dir", mount.path]
        argv += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
        for key, value in BASE_ENV.items():
            argv += ["--setenv", key, value]
        return Launch(level, argv + command, config=sandboxed, root=_top_level(layout))
    if level == "unshare":
        unshare = shutil.which("unshare")
        if unshare is None or not os.path.exists("/bin/sh") or shutil.which("pivot_root", path=_SBIN_PATH) is None:
            raise OSError("unshare and pivot_root (util-linux) are not installed")
        # setpriv makes unshare die with us (its --kill-child then takes the worker's namespace down).
        setpriv = shutil.which("setpriv")
        argv = [setpriv, "--pdeathsig", "KILL"] if setpriv else []
        argv += [unshare] + ([] if root else ["--map-root-user"])
        argv += ["--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts"]
        prelude = _unshare_prelude(layout)
        return Launch(
            level,
            argv + ["/bin/sh", "-c", prelude, "flowrl-sandbox"] + command,
            config=sandboxed,
            root=_top_level(layout),
        )
    raise ValueError(f"unknown isolation level {level!r}")


def _unshare_prelude(layout: list[Mount]) -> str:
    """A shell script run as PID 1 of the new namespaces before exec'ing the worker: what bwrap does
    with its options, by hand. It builds the new root in a scratch tmpfs (the layout, a minimal /dev
    and the namespace's /proc), makes all of it read-only but /tmp and /dev/shm, and pivots into it;
    the host's root is then unmounted, out of reach."""
    q = shlex.quote
    lines = [
        "set -e",
        "umask 022",
        f"PATH={_SBIN_PATH}",
        "mount -t tmpfs -o mode=755 tmpfs /dev/shm",  # scratch, left behind with the old root
        "R=/dev/shm/root",
        'mkdir "$R"',
        'mount -t tmpfs -o mode=755 tmpfs "$R"',
    ]
    for mount in layout:
        target = '"$R"' + q(mount.path)
        if mount.kind == "symlink":
            lines.append(f"ln -s {q(mount.arg)} {target}")
        elif mount.kind == "dir":
            lines.append(f"mkdir -p {target}")
        elif mount.kind == "tmpfs":
            lines += [f"mkdir -p {target}", f"mount -t tmpfs -o mode={mount.arg} tmpfs {target}"]
        elif os.path.isdir(mount.path):
            lines += [f"mkdir -p {target}", f"mount --rbind {q(mount.path)} {target}"]
        else:
            lines += [f"touch {target}", f"mount --bind {q(mount.path)} {target}"]
    lines += [
        'mkdir "$R/dev" "$R/proc" "$R/.old"',
        'mount -t tmpfs -o mode=755 tmpfs "$R/dev"',
        "for n in null zero full random urandom tty; do",
        '  [ -e "/dev/$n" ] || continue; touch "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"',
        "done",
        'ln -s /proc/self/fd "$R/dev/fd"',
        (
            'ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"; '
            'ln -s /proc/self/fd/2 "$R/dev/stderr"'
        ),
        'mkdir "$R/dev/shm"',
        'mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"',
        'mount --rbind /proc "$R/proc"',  # unshare --mount-proc made it for our PID namespace
        "cut -d' ' -f5 /proc/self/mountinfo | while read -r m; do case \"$m\" in",
        '  "$R/tmp"|"$R/dev/shm"|"$R/proc"|"$R/proc/"*) ;;',
        '  "$R/"*) mount -o remount,bind,ro "$m" ;;',
        "esac; done",
        'cd "$R"',
        "pivot_root . .old",
        "umount -l /.old",
        "rmdir /.old",
        "mount -o remount,bind,ro /",
        "cd /tmp",
        'exec "$@"',
    ]
    return "\n".join(lines)


def check_facts(launch: Launch, facts: dict[str, Any]) -> str | None:
    """What is wrong with a started worker's isolation, or None when it is what its level promises."""
    if launch.level == "rlimits":
        return None
    problems = []
    if launch.root is not None and facts.get("root") != launch.root:
        problems.append(f"/ holds {facts.get('root')}, expected only {launch.root}")
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
        data = code.encode("utf-8")
        self._send({"id": self.next_id, "language": language, "timeout": timeout, "size": len(data)}, data)
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
                proc.stdin.write(_frame({"cmd": "exit"}))  # type: ignore[union-attr]
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

    def _send(self, msg: dict[str, Any], payload: bytes = b"") -> None:
        proc = self.proc
        if proc is None or proc.stdin is None:
            raise WorkerDied("the worker is not running")
        try:
            proc.stdin.write(_frame(msg) + payload)
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


def _frame(msg: dict[str, Any]) -> bytes:
    """A message to the worker: 8 hex digits of length, then the JSON (see sandbox_worker)."""
    body = orjson.dumps(msg)
    return b"%08x" % len(body) + body
