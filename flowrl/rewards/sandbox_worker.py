"""The zygote: a warm Python process that forks once per job. Run by `flowrl.rewards.sandbox` only.

This file is executed as `python -I -S -c <this source>` (inside bubblewrap or unshare when available),
so it must import nothing but the standard library and nothing of flowrl's. It speaks newline-delimited
JSON on its stdin/stdout:

    host -> zygote   {"config": {...}}                       once, first line
    zygote -> host   {"ready": true, "pid": .., "uid": .., "ifaces": [..], "root_writable": ..}
    host -> zygote   {"id": 7, "language": "python"|"bash", "code": "...", "timeout": 2.0}
    zygote -> host   {"id": 7, "status": "ok"|"error"|"timeout"|"oom"|"killed"|"infra_error",
                      "exit_code": 0, "stdout": "...", "stderr": "...", "duration": 0.001, ...}

Per job it forks a child that: starts a new session (so the whole group can be killed), gets a fresh
temporary working directory, stdin on /dev/null, stdout/stderr on bounded pipes, a clean environment,
rlimits (address space, CPU seconds, file size, open files, core 0, processes), no_new_privs, and,
when the zygote runs as root, an unprivileged uid/gid (65534 by default) or else no capabilities.
After the job every process the job left behind is killed: the whole PID namespace when the zygote is
its init, else the process group plus every orphan reparented to the zygote (it is a subreaper).
"""

import _signal
import builtins
import ctypes
import errno
import gc
import json
import linecache
import math
import os
import resource
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback

_PR_SET_PDEATHSIG = 1
_PR_SET_SECUREBITS = 28
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_DUMPABLE = 4
_SECBIT_NOROOT_ALL = 0x3 | 0x4 | 0x8 | 0x10 | 0x20  # NOROOT(+LOCKED), NO_SETUID_FIXUP(+LOCKED), KEEP_CAPS_LOCKED

_LIBC = ctypes.CDLL(None, use_errno=True)
_RESET_SIGNALS = (int(signal.SIGINT), int(signal.SIGTERM), int(signal.SIGCHLD))
_SIG_DFL = int(signal.SIG_DFL)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_all_capabilities() -> None:
    """uid 0 without a uid to drop to (user namespace): no capabilities, and exec cannot regain them."""
    _LIBC.prctl(_PR_SET_SECUREBITS, _SECBIT_NOROOT_ALL, 0, 0, 0)
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    if _LIBC.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _send(out_fd: int, obj: dict) -> None:
    data = (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
    view = memoryview(data)
    while view:
        n = os.write(out_fd, view)
        view = view[n:]


class Zygote:
    def __init__(self, in_fd: int, out_fd: int, config: dict) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.cfg = config
        self.own_pid_ns = bool(config.get("own_pid_ns")) and os.getpid() == 1
        self.private_tmp = bool(config.get("private_tmp"))
        # Where job directories go: our private /tmp, or (shared /tmp) a folder the host made for us.
        self.tmp_root = config.get("tmp_root") or tempfile.gettempdir()
        self.drop_uid = config.get("drop_uid")
        self.drop_gid = config.get("drop_gid")
        self.max_output = int(config.get("max_output", 65536))
        self.output_kill = int(config.get("output_kill", 16 * 1024 * 1024))
        self.devnull = os.open(os.devnull, os.O_RDWR)
        self.bash = config.get("bash") or shutil.which("bash") or "/bin/sh"
        self.maxfd = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.buffer = b""
        self.limits = self.static_limits()
        # Our own environment is the jobs' (less TMPDIR): a child then changes one variable, not all.
        self.env = {str(k): str(v) for k, v in (config.get("env") or {}).items()}
        os.environ.clear()
        os.environ.update(self.env)
        # Text streams for the job, built once here; in the child they sit on the job's pipes (fds 0-2).
        self.stdio = (
            open(0, closefd=False, encoding="utf-8", errors="replace"),
            open(1, "w", closefd=False, encoding="utf-8", errors="backslashreplace"),
            open(2, "w", closefd=False, encoding="utf-8", errors="backslashreplace", buffering=1),
        )

    # -- protocol ----------------------------------------------------------------------------------
    def read_message(self):
        while b"\n" not in self.buffer:
            chunk = os.read(self.in_fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def serve(self) -> None:
        while True:
            msg = self.read_message()
            if msg is None or msg.get("cmd") == "exit":
                return
            try:
                result = self.run_job(msg)
            except Exception as exc:  # the zygote itself failed: report it, keep serving
                result = {"status": "infra_error", "error": f"zygote: {type(exc).__name__}: {exc}"}
            result["id"] = msg.get("id")
            _send(self.out_fd, result)

    # -- one job -------------------------------------------------------------------------------------
    def run_job(self, job: dict) -> dict:
        language = job.get("language", "python")
        if language not in ("python", "bash"):
            return {"status": "infra_error", "error": f"unknown language {language!r}"}
        timeout = float(job.get("timeout") or self.cfg.get("timeout", 5.0))
        workdir = tempfile.mkdtemp(prefix="job-", dir=self.tmp_root)
        if self.drop_uid is not None:
            os.chown(workdir, self.drop_uid, self.drop_gid)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        # The child's note to us if setting it up fails. Closed before the job's own code runs (and
        # close-on-exec for bash), so nothing the job does can write "setup:" into it.
        st_r, st_w = os.pipe()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the forked child
            self.child(job.get("code", ""), language, timeout, workdir, out_w, err_w, st_w)
        for fd in (out_w, err_w, st_w):
            os.close(fd)
        try:
            return self.supervise(pid, start, timeout, out_r, err_r, st_r)
        finally:
            for fd in (out_r, err_r, st_r):
                os.close(fd)
            self.cleanup(workdir)

    def child(self, code, language, timeout, workdir, out_w, err_w, st_w) -> None:  # pragma: no cover
        notes = st_w
        try:
            os.setsid()
            os.dup2(self.devnull, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            notes = 3 if st_w == 3 else os.dup2(st_w, 3, inheritable=False)
            os.closerange(4, self.maxfd)
            for sig in _RESET_SIGNALS:  # _signal with ints: the enum wrappers of `signal` cost page faults
                _signal.signal(sig, _SIG_DFL)
            os.chdir(workdir)
            self.apply_limits(timeout)
            if self.drop_uid is not None:
                os.setgroups([])
                os.setresgid(self.drop_gid, self.drop_gid, self.drop_gid)
                os.setresuid(self.drop_uid, self.drop_uid, self.drop_uid)
            elif os.getuid() == 0:
                _drop_all_capabilities()
            if not self.own_pid_ns:
                _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            os.environ["TMPDIR"] = workdir
            if language == "bash":
                _signal.signal(int(signal.SIGPIPE), _SIG_DFL)  # Python ignores these; a shell must not
                _signal.signal(int(signal.SIGXFSZ), _SIG_DFL)
                os.execve(self.bash, [os.path.basename(self.bash), "-c", code], dict(self.env, TMPDIR=workdir))
            os.close(notes)
        except BaseException as exc:
            try:
                os.write(notes, f"setup:{type(exc).__name__}: {exc}".encode())
            finally:
                os._exit(125)
        os._exit(_run_python(code, self.stdio))

    def static_limits(self) -> list:
        """The rlimits every job gets (all but CPU time), capped by the hard limits we have."""
        limits = [(resource.RLIMIT_CORE, 0)]
        for key, which in (
            ("memory_bytes", resource.RLIMIT_AS),
            ("max_file_size", resource.RLIMIT_FSIZE),
            ("max_open_files", resource.RLIMIT_NOFILE),
            ("nproc", resource.RLIMIT_NPROC),
        ):
            if self.cfg.get(key):
                limits.append((which, int(self.cfg[key])))
        capped = []
        for which, value in limits:
            hard = resource.getrlimit(which)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            capped.append((which, (value, value)))
        return capped

    def apply_limits(self, timeout: float) -> None:  # pragma: no cover - runs in the forked child
        cpu_soft = max(1, math.ceil(self.cfg.get("cpu_time") or timeout))
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        if hard != resource.RLIM_INFINITY:
            cpu_soft = min(cpu_soft, hard - 1) if hard > 1 else hard
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_soft, cpu_soft + 1 if hard == resource.RLIM_INFINITY else hard))
        for which, pair in self.limits:
            resource.setrlimit(which, pair)

    def supervise(self, pid, start, timeout, out_r, err_r, st_r) -> dict:
        """Collect the job's output until its main process exits or time runs out; then kill
        everything it left behind and say what happened."""
        deadline = start + timeout
        streams = {out_r: bytearray(), err_r: bytearray()}
        totals = {out_r: 0, err_r: 0}
        poller = select.poll()
        for fd in (out_r, err_r, self.in_fd):
            poller.register(fd, select.POLLIN)
        try:
            pidfd = os.pidfd_open(pid)
            poller.register(pidfd, select.POLLIN)
        except (AttributeError, OSError):
            pidfd = None
        open_fds = {out_r, err_r}
        exited = timed_out = output_killed = False
        while not exited and not output_killed:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if pidfd is None or not open_fds:  # no pidfd, or the job closed its outputs: ask
                exited = _exited(pid)
                wait = min(deadline - now, 0.01)
            else:
                wait = deadline - now
            for fd, _ev in poller.poll(max(1, math.ceil(wait * 1000))):
                if fd == pidfd:
                    exited = True
                elif fd == self.in_fd:  # the host wrote (keep it for later) or went away (stop now)
                    data = _read(fd)
                    if not data:
                        self.kill_job(pid)
                        os._exit(0)
                    self.buffer += data
                elif chunk := _read(fd):
                    output_killed |= self.keep(streams[fd], chunk, totals, fd)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
        self.kill_job(pid)
        for fd in open_fds:  # the job is dead: take what is left in its pipes
            while chunk := _read(fd, block=False):
                self.keep(streams[fd], chunk, totals, fd)
        _, status, usage = os.wait4(pid, 0)
        if pidfd is not None:
            os.close(pidfd)
        if self.own_pid_ns:
            self.empty_namespace()
        else:
            self.kill_orphans()
        out, err = streams[out_r], streams[err_r]
        result = {
            "exit_code": os.waitstatus_to_exitcode(status),  # -N when killed by signal N
            "stdout": bytes(out).decode("utf-8", "replace"),
            "stderr": bytes(err).decode("utf-8", "replace"),
            "stdout_truncated": totals[out_r] > len(out),
            "stderr_truncated": totals[err_r] > len(err),
            "duration": round(time.monotonic() - start, 6),
            "cpu_time": round(usage.ru_utime + usage.ru_stime, 6),
        }
        notes = _read(st_r, block=False).decode("utf-8", "replace")
        result.update(self.verdict(result, timeout, timed_out, output_killed, notes))
        return result

    def keep(self, buf: bytearray, chunk: bytes, totals: dict, fd: int) -> bool:
        """Keep the first `max_output` bytes of a stream; True once it is past `output_kill`."""
        totals[fd] += len(chunk)
        if len(buf) < self.max_output:
            buf += chunk[: self.max_output - len(buf)]
        return totals[fd] > self.output_kill

    def verdict(self, result: dict, timeout: float, timed_out: bool, output_killed: bool, notes: str) -> dict:
        rc, cpu_s = result["exit_code"], result["cpu_time"]
        cpu_limit = max(1, math.ceil(self.cfg.get("cpu_time") or timeout))
        if notes.startswith("setup:"):  # only our own code could write it: the sandbox failed, not the job
            return {"status": "infra_error", "error": notes[len("setup:") :]}
        if timed_out:
            return {"status": "timeout", "reason": f"wall time over {timeout:g} s"}
        if rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and cpu_s >= cpu_limit - 0.05):
            return {"status": "timeout", "reason": f"CPU time over {cpu_limit} s"}
        if output_killed:
            return {"status": "killed", "reason": f"output over {self.output_kill} bytes"}
        tail = result["stderr"][-300:]
        if rc != 0 and ("\nMemoryError" in tail or "cannot allocate memory" in tail.lower()):
            return {"status": "oom", "reason": "memory limit"}
        return {"status": "ok" if rc == 0 else "error" if rc > 0 else "killed"}

    def kill_job(self, pid: int) -> None:
        """Kill the job's process group and, in our own PID namespace, everything else in it."""
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if self.own_pid_ns:
            try:
                os.kill(-1, signal.SIGKILL)  # everything in our namespace but us, its init
            except OSError:
                pass

    def empty_namespace(self) -> None:
        """As init of our PID namespace: kill and reap until we are alone in it (a fork bomb may fork
        while the first kill(-1) walks the process list)."""
        for _ in range(1000):
            self.reap_orphans()
            if not any(name.isdigit() and name != "1" for name in os.listdir("/proc")):
                return
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
            time.sleep(0.001)

    def kill_orphans(self) -> None:
        """Without a PID namespace: kill what escaped the job's process group (its own session, say).
        When their parents die such processes are reparented to us (a subreaper), so kill our children
        until none is left. Runs after the job itself was reaped."""
        me = os.getpid()
        for _ in range(100):
            found = []
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                try:
                    with open(f"/proc/{name}/stat", "rb") as fh:
                        stat = fh.read()
                    ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
                except (OSError, ValueError):
                    continue
                if ppid == me:
                    found.append(int(name))
            if not found:
                return
            for child in found:
                try:
                    os.kill(child, signal.SIGKILL)
                except OSError:
                    pass
            for child in found:
                try:
                    os.waitpid(child, 0)
                except ChildProcessError:
                    pass

    def reap_orphans(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def cleanup(self, workdir: str) -> None:
        shutil.rmtree(workdir, ignore_errors=True)
        if self.private_tmp:  # /tmp and /dev/shm are ours alone: leave nothing for the next job
            for root in (self.tmp_root, "/dev/shm"):
                try:
                    names = os.listdir(root)
                except OSError:
                    continue
                for name in names:
                    path = os.path.join(root, name)
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        try:
                            os.unlink(path)
                        except OSError:
                            pass


def _exited(pid: int) -> bool:
    """True once the job's main process is a zombie (not reaped yet, so its pgid stays reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _read(fd: int, block: bool = True) -> bytes:
    if not block:
        os.set_blocking(fd, False)
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return b""
    except OSError as exc:
        if exc.errno in (errno.EIO, errno.EBADF):
            return b""
        raise


def _run_python(code: str, stdio: tuple) -> int:  # pragma: no cover - runs in the forked child
    """Run a Python snippet as `python -c` would; return its exit status (SystemExit codes propagate)."""
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = stdio
    sys.argv = ["-c"]
    filename = "<snippet>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    status = 0
    try:
        exec(compile(code, filename, "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException:
        status = 1
        _print_exception()
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return status


def _exit_status(code) -> int:  # pragma: no cover - runs in the forked child
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _print_exception() -> None:  # pragma: no cover - runs in the forked child
    try:
        etype, value, tb = sys.exc_info()
        traceback.print_exception(etype, value, tb.tb_next if tb is not None else None)
    except BaseException:
        try:
            os.write(2, b"exception while printing the traceback\n")
        except OSError:
            pass


def _facts() -> dict:
    """What this zygote sees: the host checks it against the isolation it asked for."""
    try:
        ifaces = sorted(name for _, name in socket.if_nameindex())
    except OSError:
        ifaces = []
    return {
        "ready": True,
        "pid": os.getpid(),
        "uid": os.getuid(),
        "ifaces": ifaces,
        "root_writable": os.access("/", os.W_OK),
        "python": sys.version.split()[0],
    }


def _warm_up() -> None:
    """Pay once, in the zygote, what every forked child would otherwise pay again: the first compile()
    (about 1 ms), the first traceback, the first text stream."""
    import io

    sink = io.StringIO()
    exec(compile("print(sum(i * i for i in range(3)), file=out)", "<warm-up>", "exec"), {"out": sink})
    try:
        exec(compile("1 / 0", "<warm-up>", "exec"), {})
    except ZeroDivisionError:
        traceback.print_exc(file=sink)
    open(os.devnull, "w", encoding="utf-8", errors="backslashreplace").close()


def main() -> None:
    # The protocol moves off fds 0/1, so nothing a job inherits can reach it.
    in_fd, out_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as PID 1, no handler means no signal from a job
    # Not dumpable: a job running as our uid cannot open /proc/<us>/fd/* (our protocol pipes: it could
    # read the next job or write a forged result) nor ptrace us.
    _LIBC.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    # no_new_privs for us and so for every job (inherited over fork and exec): no set-uid binary or
    # file capability can raise a job's privileges.
    _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    buffer = b""
    while b"\n" not in buffer:
        chunk = os.read(in_fd, 1 << 16)
        if not chunk:
            return
        buffer += chunk
    line, _, rest = buffer.partition(b"\n")
    config = json.loads(line)["config"]
    if not config.get("own_pid_ns"):
        _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if config.get("die_with_parent"):
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for path in config.get("sys_path") or ():
        if path not in sys.path:
            sys.path.append(path)
    for name in config.get("preload") or ():
        try:
            __import__(name)
        except Exception:  # a missing optional module is not the zygote's failure
            pass
    _warm_up()
    zygote = Zygote(in_fd, out_fd, config)
    gc.collect()
    gc.freeze()  # the children's collector then leaves the zygote's objects (and their pages) alone
    zygote.buffer = rest
    _send(out_fd, _facts())
    zygote.serve()


if __name__ == "__main__":
    main()
