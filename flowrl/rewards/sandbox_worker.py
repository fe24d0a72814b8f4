"""The zygote: a warm Python process whose pristine copy forks once per job. Run by
`flowrl.rewards.sandbox` only.

This file is executed as `python -I -S -c <this source>` (inside bubblewrap or unshare when available),
so it must import nothing but the standard library and nothing of flowrl's. The host writes frames (8
hex digits giving the length, then that much JSON), a job's frame followed by its code; the zygote
answers with newline-delimited JSON:

    host -> zygote   {"config": {...}}                                      once, first
    zygote -> host   {"ready": true, "pid": .., "uid": .., "ifaces": [..], "root_writable": .., "root": [..]}
    host -> zygote   {"id": 7, "language": "python"|"bash", "timeout": 2.0, "size": 123} + 123 bytes of code
    zygote -> host   {"id": 7, "status": "ok"|"error"|"timeout"|"oom"|"killed"|"infra_error",
                      "exit_code": 0, "stdout": "...", "stderr": "...", "duration": 0.001, ...}
    host -> zygote   {"cmd": "exit"}

Two processes share the work. The zygote (init of the worker's PID namespace, when it has one) talks
to the host, supervises each job's output and time, and cleans up after it; it never forks a job. The
fork server, forked from it once at start-up before any job existed, forks each job and kills and
reaps whatever the job leaves behind; it never sees a job's code (the job reads it from a memfd) nor
its output. So every job is a copy of a process that no other job's code, output or leftovers ever
entered. The job's fork starts a new session (so the whole group can be killed), gets a fresh
temporary working directory, stdin on /dev/null, stdout/stderr on bounded pipes, a clean environment,
rlimits (address space, CPU seconds, file size, open files, core 0, processes, POSIX message queues 0),
no_new_privs, a seccomp filter refusing the kernel keyrings, and, when the zygote runs as root, an
unprivileged uid/gid (65534 by default) or else no capabilities. In the zygote's own PID namespace the
fork server is init of a PID and mount namespace of its own, with its own /proc, where the jobs run: a job
sees the fork server (PID 1: as init it takes no signal from inside, and it is not dumpable) and its own
processes, never the zygote that holds every job's code and output.
After the job every process it left behind is killed, its files are deleted and, in the worker's own
IPC namespace, every System V object is removed. What cannot be cleaned retires the worker: the reply
says "retire" and the zygote exits, taking its namespaces with it.
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
import struct
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
_IPC_RMID, _MSG_INFO, _SHM_INFO, _SEM_INFO = 0, 12, 14, 19
_FORK_SERVER_GRACE = 5.0  # seconds the fork server has to report a job it was told to kill
_CLONE_NEWNS, _CLONE_NEWPID = 0x00020000, 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 16384, 1 << 18


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


# seccomp: the kernel keyring calls fail with ENOSYS in a job. A uid's keyrings belong to the kernel,
# not to a namespace, so every job of every worker (all uid 65534) would share them.
_KEYRING_CALLS = {  # audit arch: (add_key, request_key, keyctl)
    0xC000003E: (248, 249, 250),  # x86_64 (its x32 calls, bit 30 set, are refused whole)
    0x40000003: (286, 287, 288),  # i386, reachable from x86_64 by int 0x80
    0xC00000B7: (217, 218, 219),  # aarch64
    0x40000028: (309, 310, 311),  # arm, reachable from aarch64
}
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _keyring_filter() -> bytes:
    """The BPF program: keyring calls, x32 calls and ABIs not in the table get ENOSYS; all else runs."""
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, refuse = (ret, 0, 0, 0x7FFF0000), (ret, 0, 0, 0x00050000 | errno.ENOSYS)
    program = [(ld, 0, 0, 4)]  # seccomp_data.arch
    for arch, calls in _KEYRING_CALLS.items():
        tests = [(jge, 0x40000000)] if arch == 0xC000003E else []
        tests += [(jeq, nr) for nr in calls]
        refused = len(tests) + 2  # the body: load nr, the tests, allow, refuse
        body = [(ld, 0, 0, 0)] + [(op, refused - i, 0, k) for i, (op, k) in enumerate(tests, 1)] + [allow, refuse]
        program += [(jeq, 0, len(body), arch), *body]
    program.append(refuse)
    return b"".join(struct.pack("HBBI", *step) for step in program)


def _install_filter(program: bytes) -> None:
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    if _LIBC.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot install the seccomp filter")


def _filter_works(program: bytes) -> bool:
    """Whether this kernel takes the filter (tried once, in a throwaway child)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child
        try:
            _install_filter(program)
            os._exit(0)
        finally:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _send(out_fd: int, obj: dict) -> None:
    data = (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
    view = memoryview(data)
    while view:
        n = os.write(out_fd, view)
        view = view[n:]


class ForkServerLost(Exception):
    """The fork server died or stopped answering: only a job that shares its uid can do that."""


class Zygote:
    def __init__(self, in_fd: int, out_fd: int, config: dict) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.cfg = config
        self.own_pid_ns = bool(config.get("own_pid_ns")) and os.getpid() == 1
        # The fork server as init of a PID and mount namespace of its own, with its own /proc, where the jobs
        # run: a job sees it (PID 1) and its own processes, never us; as init it takes no signal from inside
        # (none it has no handler for: it has none) and it is not dumpable. Needs CAP_SYS_ADMIN here.
        self.job_pid_ns = self.own_pid_ns and _can_unshare_pid()
        self.private_tmp = bool(config.get("private_tmp"))
        # Where job directories go: our private /tmp, or (shared /tmp) a folder the host made for us.
        self.tmp_root = config.get("tmp_root") or tempfile.gettempdir()
        # The ids a job runs as when we are root: the host sends drop_gid with drop_uid (None when not root).
        self.drop_uid: int | None = config.get("drop_uid")
        self.drop_gid: int = config["drop_gid"] if self.drop_uid is not None else -1  # read only with drop_uid
        self.max_output = int(config.get("max_output", 65536))
        self.output_kill = int(config.get("output_kill", 16 * 1024 * 1024))
        self.devnull = os.open(os.devnull, os.O_RDWR)
        self.bash = config.get("bash") or shutil.which("bash") or "/bin/sh"
        self.maxfd = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.limits = self.static_limits()
        program = _keyring_filter()
        self.seccomp = program if _filter_works(program) else None
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
        self.server: socket.socket  # our end of the fork server's socket: set by start_fork_server()
        self.server_pid = 0
        self.dirty = False  # in the fork server: something the last job left would not die

    def start_fork_server(self) -> None:
        """Fork the fork server now, while nothing of any job is in our memory."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if self.job_pid_ns and _LIBC.unshare(_CLONE_NEWPID) != 0:  # our next child: init of a new namespace
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID) failed")
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the fork server
            status = 1
            try:
                ours.close()
                os.close(self.in_fd)
                os.close(self.out_fd)
                if self.job_pid_ns:
                    _own_proc()
                _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # what a job leaves behind comes to us
                self.fork_jobs(theirs)
                status = 0
            finally:
                os._exit(status)
        theirs.close()
        self.server, self.server_pid = ours, pid

    # -- the zygote: the host's side -----------------------------------------------------------------
    def serve(self) -> None:
        try:
            while True:
                header = _read_frame(self.in_fd)
                if header is None or header.get("cmd") == "exit":
                    return
                code = _read_exact(self.in_fd, int(header.get("size") or 0))
                if code is None:
                    return
                try:
                    result = self.run_job(header, code)
                except ForkServerLost as exc:  # its namespace ends whatever the job left running
                    result = {"status": "killed", "reason": str(exc), "retire": True}
                except Exception as exc:  # the zygote itself failed: report it, then retire
                    result = {"status": "infra_error", "error": f"zygote: {type(exc).__name__}: {exc}", "retire": True}
                result["id"] = header.get("id")
                _send(self.out_fd, result)
                if result.get("retire"):
                    return
        finally:
            self.server.close()  # the fork server ends the job it runs, if any, and exits
            if not self.own_pid_ns:  # (with one, our exit ends every process in our namespace)
                for _ in range(200):
                    if os.waitpid(self.server_pid, os.WNOHANG)[0]:
                        break
                    time.sleep(0.01)
                else:  # stopped by a job
                    os.kill(self.server_pid, signal.SIGKILL)
                    os.waitpid(self.server_pid, 0)
                self.kill_orphans()

    def run_job(self, job: dict, code: bytes) -> dict:
        language = job.get("language", "python")
        if language not in ("python", "bash"):
            return {"status": "infra_error", "error": f"unknown language {language!r}"}
        timeout = float(job.get("timeout") or self.cfg.get("timeout", 5.0))
        workdir = tempfile.mkdtemp(prefix="job-", dir=self.tmp_root)
        if self.drop_uid is not None:
            os.chown(workdir, self.drop_uid, self.drop_gid)
        code_fd = os.memfd_create("job", 0)  # the job reads its code here: the fork server never does
        os.write(code_fd, code)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        # The child's note to us if setting it up fails. Closed before the job's own code runs (and
        # close-on-exec for bash), so nothing the job does can write "setup:" into it.
        st_r, st_w = os.pipe()
        start = time.monotonic()
        request = {"language": language, "timeout": timeout, "workdir": workdir}
        try:
            socket.send_fds(self.server, [json.dumps(request).encode()], [code_fd, out_w, err_w, st_w])
        except OSError as exc:  # between jobs: not this job's doing
            return {"status": "infra_error", "error": f"the fork server is gone: {exc}", "retire": True}
        finally:
            for fd in (code_fd, out_w, err_w, st_w):
                os.close(fd)
        try:
            return self.supervise(start, timeout, out_r, err_r, st_r)
        finally:
            for fd in (out_r, err_r, st_r):
                os.close(fd)
            self.cleanup(workdir)

    def supervise(self, start, timeout, out_r, err_r, st_r) -> dict:
        """Collect the job's output until the fork server says it is over (its main process exited,
        and everything it left behind is dead) or time runs out; then say what happened."""
        deadline = start + timeout
        streams = {out_r: bytearray(), err_r: bytearray()}
        totals = {out_r: 0, err_r: 0}
        poller = select.poll()
        for fd in (out_r, err_r, self.server.fileno()):
            poller.register(fd, select.POLLIN)
        poller.register(self.in_fd, 0)  # hang-up only: what the host queued next is not ours to read
        timed_out = output_killed = False
        killed_at = None
        report = None
        while report is None:
            now = time.monotonic()
            if killed_at is None and (now >= deadline or output_killed):
                timed_out = not output_killed
                killed_at = now
                self.ask_fork_server({"op": "kill"})
            limit = deadline if killed_at is None else killed_at + _FORK_SERVER_GRACE
            if now >= limit:
                raise ForkServerLost("the job stopped its fork server")
            for fd, _ev in poller.poll(max(1, math.ceil((limit - now) * 1000))):
                if fd == self.server.fileno():
                    report = self.server.recv(4096)
                    if not report:
                        raise ForkServerLost("the job killed its fork server")
                elif fd == self.in_fd:  # the host went away: our namespace (or the fork server) ends the job
                    os._exit(0)
                elif chunk := _read(fd):
                    output_killed |= self.keep(streams[fd], chunk, totals, fd)
                else:
                    poller.unregister(fd)
        ended = json.loads(report)
        if "error" in ended:
            return {"status": "infra_error", "error": ended["error"]}
        for fd in (out_r, err_r):  # everything of the job is dead: take what is left in its pipes
            while chunk := _read(fd, block=False):
                self.keep(streams[fd], chunk, totals, fd)
        out, err = streams[out_r], streams[err_r]
        result = {
            "exit_code": os.waitstatus_to_exitcode(ended["status"]),  # -N when killed by signal N
            "stdout": bytes(out).decode("utf-8", "replace"),
            "stderr": bytes(err).decode("utf-8", "replace"),
            "stdout_truncated": totals[out_r] > len(out),
            "stderr_truncated": totals[err_r] > len(err),
            "duration": round(time.monotonic() - start, 6),
            "cpu_time": round(ended["cpu_time"], 6),
        }
        notes = _read(st_r, block=False).decode("utf-8", "replace")
        result.update(self.verdict(result, timeout, timed_out, output_killed, notes))
        if not ended["clean"] or not self.wipe_ipc():
            result["retire"] = True
        return result

    def ask_fork_server(self, request: dict) -> None:
        try:
            self.server.send(json.dumps(request).encode())
        except OSError as exc:
            raise ForkServerLost(f"the job killed its fork server: {exc}") from exc

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

    def wipe_ipc(self) -> bool:
        """Remove every System V object (shared memory, semaphores, message queues) the job left in
        our IPC namespace; True when none is left. Only its creator (or CAP_SYS_ADMIN, which we lack)
        may remove one, so we take the job's uid for it."""
        if not self.cfg.get("own_ipc_ns"):
            return True  # rlimits: the host's IPC namespace is not ours to empty (see the docs)
        if not _sysv_in_use():
            return True
        if self.drop_uid is not None:
            os.setresuid(-1, self.drop_uid, -1)
        try:
            for kind, ident in _sysv_objects():
                if kind == "shm":
                    _LIBC.shmctl(ident, _IPC_RMID, None)
                elif kind == "sem":
                    _LIBC.semctl(ident, 0, _IPC_RMID, 0)
                else:
                    _LIBC.msgctl(ident, _IPC_RMID, None)
        finally:
            if self.drop_uid is not None:
                os.setresuid(-1, 0, -1)
        return not _sysv_objects()

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

    def static_limits(self) -> list:
        """The rlimits every job gets (all but CPU time), capped by the hard limits we have."""
        # RLIMIT_MSGQUEUE 0: a job cannot create a POSIX message queue (the kernel counts a queue's
        # whole size against it, with no exemption), so none can outlive it for the next job to open.
        limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_MSGQUEUE, 0)]
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

    def kill_job(self, pid: int) -> None:
        """Kill the job's process group and, in our own PID namespace, everything else in it."""
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if self.own_pid_ns:
            try:
                os.kill(-1, signal.SIGKILL)  # everything in our namespace but us and its init
            except OSError:
                pass

    def empty_namespace(self) -> None:
        """In our own PID namespace: kill and reap until only the zygote (its init) and we are left (a
        fork bomb may fork while the first kill(-1) walks the process list). Orphans come to us, a
        subreaper, to be reaped; what will not die leaves us dirty."""
        alone = {"1", str(os.getpid())}
        for _ in range(1000):
            self.reap_orphans()
            if not any(name.isdigit() and name not in alone for name in os.listdir("/proc")):
                return
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
            time.sleep(0.001)
        self.dirty = True

    def kill_orphans(self) -> None:
        """Without a PID namespace: kill what escaped the job's process group (its own session, say).
        When their parents die such processes are reparented to us (a subreaper), so kill our children
        until none is left. Runs after the job itself was reaped."""
        me = os.getpid()
        for _ in range(100):
            found = _children().get(me, [])
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
        self.dirty = True

    def reap_orphans(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    # -- the fork server ----------------------------------------------------------------------------
    def fork_jobs(self, server: socket.socket) -> None:  # pragma: no cover - runs in the fork server
        """Fork each job the zygote asks for; when its main process exits or the zygote says so, kill
        everything the job left behind and report how it ended. Ends when the zygote does."""
        while True:
            try:
                message, fds, _flags, _addr = socket.recv_fds(server, 4096, 4)
            except OSError:
                return
            if not message:
                return
            request = json.loads(message)
            if request.get("op") == "kill" or len(fds) != 4:  # late: the job it meant has ended
                for fd in fds:
                    os.close(fd)
                continue
            code_fd, out_w, err_w, st_w = fds
            try:
                pid = os.fork()
            except OSError as exc:
                pid = -1
                server.send(json.dumps({"error": f"fork server: cannot fork the job: {exc}"}).encode())
            if pid == 0:
                self.child(code_fd, request["language"], request["timeout"], request["workdir"], out_w, err_w, st_w)
            for fd in fds:
                os.close(fd)
            if pid < 0:
                continue
            gone = self.watch(pid, server)
            self.kill_job(pid)
            _, status, usage = os.wait4(pid, 0)
            if self.own_pid_ns:
                self.empty_namespace()
            else:
                self.kill_orphans()
            if gone:
                return
            ended = {"status": status, "cpu_time": usage.ru_utime + usage.ru_stime, "clean": not self.dirty}
            server.send(json.dumps(ended).encode())

    def watch(self, pid: int, server: socket.socket) -> bool:  # pragma: no cover - runs in the fork server
        """Wait until the job's main process exits or the zygote asks to kill it; True when the zygote
        is gone."""
        poller = select.poll()
        poller.register(server.fileno(), select.POLLIN)
        try:
            pidfd = os.pidfd_open(pid)
            poller.register(pidfd, select.POLLIN)
        except (AttributeError, OSError):
            pidfd = None
        try:
            while True:
                for fd, _ev in poller.poll(-1 if pidfd is not None else 10):
                    if fd == pidfd:
                        return False
                    return not server.recv(4096)  # "kill", or the zygote is gone
                if pidfd is None and _exited(pid):
                    return False
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def child(self, code_fd, language, timeout, workdir, out_w, err_w, st_w) -> None:  # pragma: no cover
        notes = st_w
        try:
            code = os.pread(code_fd, os.fstat(code_fd).st_size, 0).decode("utf-8", "replace")
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
            else:  # root in a user namespace, or a uid given capabilities (bwrap --cap-add): none for the job
                _drop_all_capabilities()
            if not self.own_pid_ns:
                _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if self.seccomp is not None:
                _install_filter(self.seccomp)
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


def _children() -> dict:
    """Parent pid -> the pids of its children, from /proc (what we may see of it)."""
    children: dict = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
            children.setdefault(int(stat[stat.rindex(b")") + 2 :].split()[1]), []).append(int(name))
        except (OSError, ValueError):
            continue
    return children


def _own_proc() -> None:  # pragma: no cover - runs in the fork server, init of its namespace
    """A mount namespace of our own, with a /proc that shows our PID namespace only."""
    if _LIBC.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    if _LIBC.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "making our mounts private failed")
    if _LIBC.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) != 0:
        raise OSError(ctypes.get_errno(), "mounting /proc failed")


def _can_unshare_pid() -> bool:
    """Whether the fork server can be init of a PID and mount namespace with its own /proc (CAP_SYS_ADMIN here):
    tried in a child, whose own child does what the fork server will."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the probe
        ok = 1
        try:
            if _LIBC.unshare(_CLONE_NEWPID) == 0:
                inner = os.fork()
                if inner == 0:
                    try:
                        _own_proc()
                        os._exit(0)
                    finally:
                        os._exit(1)
                ok = os.waitstatus_to_exitcode(os.waitpid(inner, 0)[1])
        finally:
            os._exit(ok)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _sysv_in_use() -> bool:
    """Whether our IPC namespace holds any System V object: three system calls, no files read."""
    info = ctypes.create_string_buffer(256)
    used = 0
    for call, op, offset in ((_LIBC.shmctl, _SHM_INFO, 0), (_LIBC.msgctl, _MSG_INFO, 0)):
        if call(0, op, info) < 0:
            return True  # cannot tell: look
        used += int.from_bytes(info.raw[offset : offset + 4], sys.byteorder)
    if _LIBC.semctl(0, 0, _SEM_INFO, info) < 0:
        return True
    return used + int.from_bytes(info.raw[28:32], sys.byteorder) > 0  # shm used_ids, msgpool, semusz


def _sysv_objects() -> list[tuple[str, int]]:
    """Every System V IPC object of our IPC namespace, as (kind, id)."""
    found = []
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="ascii") as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:  # a kernel without System V IPC
            continue
        found += [(kind, int(row.split()[1])) for row in rows if row.strip()]
    return found


def _read_exact(fd: int, size: int):
    """Exactly `size` bytes from the host, None at its end: never a byte of what follows them."""
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _read_frame(fd: int):
    """One message from the host: 8 hex digits of length, then that much JSON; None at its end."""
    size = _read_exact(fd, 8)
    body = _read_exact(fd, int(size, 16)) if size is not None else None
    return json.loads(body) if body is not None else None


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
    sys.stdin, sys.stdout, sys.stderr = stdio
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = stdio  # type: ignore[misc]  # Final in typeshed; rebound per job
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


def _facts(zygote: Zygote) -> dict:
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
        "root": sorted(os.listdir("/")),
        "python": sys.version.split()[0],
        "seccomp": zygote.seccomp is not None,
        "job_pid_ns": zygote.job_pid_ns,
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
    first = _read_frame(in_fd)
    if first is None:
        return
    config = first["config"]
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
    zygote.start_fork_server()
    _send(out_fd, _facts(zygote))
    zygote.serve()


if __name__ == "__main__":
    main()
