"""Per-job isolation: nothing one job leaves behind, prints or is sent may reach any other job of the
same worker, and no socket of the host is reachable. One test per attack, run at every namespace level
that works here (bwrap, unshare), on a one-worker pool so that every job lands on the same worker."""

from __future__ import annotations

import logging
import os
import platform
import secrets
import socket
import stat
import time
import uuid
from pathlib import Path

import pytest

from flowrl.errors import SandboxError
from flowrl.rewards import sandbox as sandbox_module
from flowrl.rewards.sandbox import Sandbox

TIMEOUT = 120.0  # a wall-clock limit: `find /` took 4 ms of CPU but over 20 s on a loaded machine (issue 39)
LEAK = "FLOWRL" + "LEAK"  # a leaked secret is LEAK + 32 hex digits; no job's code spells the two together

# Looks for LEAK + 32 hex digits in the job's frames, in every object the collector knows and in every
# byte of its own anonymous memory, so freed buffers are searched too; prints what it found.
SCANNER = r"""
import ctypes, gc, re, sys
pattern = re.compile(rb"FLOWRL" rb"LEAK([0-9a-f]{32})")
found = set()
frame = sys._getframe()
while frame is not None:
    for value in list(frame.f_locals.values()):
        found.update(pattern.findall(repr(value).encode("utf-8", "replace")))
    frame = frame.f_back
for obj in gc.get_objects():
    if isinstance(obj, (dict, list, tuple)):
        found.update(pattern.findall(repr(obj).encode("utf-8", "replace")))
with open("/proc/self/maps") as maps:  # every anonymous mapping (heap, arenas, stack): where data lives
    regions = [line.split() for line in maps]
for fields in regions:
    if fields[1].startswith("r") and (len(fields) < 6 or fields[5] in ("[heap]", "[stack]")):
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if end - start <= 1 << 28:
            found.update(pattern.findall(ctypes.string_at(start, end - start)))
print(sorted(token.decode() for token in found))
"""


@pytest.fixture(scope="module", params=["bwrap", "unshare"])
def level(request):
    try:
        Sandbox(workers=1, isolation=request.param).start().close()
    except SandboxError as exc:
        pytest.skip(f"{request.param} isolation does not work here (bwrap not installed or no namespaces): {exc}")
    return request.param


@pytest.fixture(scope="module")
def sandbox(level):
    with Sandbox(workers=1, isolation=level, timeout=TIMEOUT) as sb:
        yield sb


def run_ok(sandbox: Sandbox, code: str, language: str = "python") -> str:
    result = sandbox.run(code, language)
    assert result.ok, result
    return result.stdout


def test_sysv_ipc_objects_do_not_carry_over_to_the_next_job(sandbox):
    secret = secrets.token_hex(16)
    prelude = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.shmat.restype = ctypes.c_void_p\n"
        "KEY, CREATE = 0x5A17, 0o1000 | 0o666\n"
    )
    made = run_ok(
        sandbox,
        prelude + "shm = libc.shmget(KEY, 4096, CREATE)\n"
        "assert shm >= 0, ctypes.get_errno()\n"
        f"ctypes.memmove(libc.shmat(shm, None, 0), {secret.encode()!r}, 32)\n"
        "assert libc.msgget(KEY, CREATE) >= 0 and libc.semget(KEY, 1, CREATE) >= 0\n"
        "print('made')\n",
    )
    assert made == "made\n"  # SysV IPC works inside a job ...
    seen = run_ok(
        sandbox,
        prelude + "seen = []\n"
        "for kind in ('shm', 'sem', 'msg'):\n"
        "    seen += [kind + ' ' + line for line in open('/proc/sysvipc/' + kind).read().splitlines()[1:]]\n"
        "shm = libc.shmget(KEY, 0, 0)\n"
        "if shm >= 0:\n"
        "    seen.append(ctypes.string_at(libc.shmat(shm, None, 0o10000), 32).decode())\n"
        "seen += ['msg'] * (libc.msgget(KEY, 0) >= 0) + ['sem'] * (libc.semget(KEY, 1, 0) >= 0)\n"
        "print(seen)\n",
    )
    assert seen == "[]\n", f"the next job found the last job's SysV objects: {seen}"  # ... and is gone after it


def test_posix_message_queues_do_not_carry_over_to_the_next_job(sandbox):
    secret = secrets.token_hex(16)
    prelude = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "if not hasattr(libc, 'mq_open'):\n"
        "    libc = ctypes.CDLL('librt.so.1', use_errno=True)\n"
    )
    run_ok(
        sandbox,
        prelude + "q = libc.mq_open(b'/flowrl-carry', os.O_CREAT | os.O_RDWR, 0o666, None)\n"
        f"print('made' if q >= 0 and libc.mq_send(q, {secret.encode()!r}, 32, 0) == 0 else 'refused')\n",
    )
    seen = run_ok(
        sandbox,
        prelude + "q = libc.mq_open(b'/flowrl-carry', os.O_RDONLY | os.O_NONBLOCK)\n"
        "buf = ctypes.create_string_buffer(1 << 16)\n"
        "n = libc.mq_receive(q, buf, len(buf), None) if q >= 0 else -1\n"
        "print('opened' if q >= 0 else 'absent', buf.raw[: max(n, 0)].decode())\n",
    )
    assert seen.split() == ["absent"], f"the next job opened the last job's message queue: {seen}"
    assert secret not in seen


def test_a_job_cannot_read_the_previous_jobs_output_or_code(sandbox):
    in_code = secrets.token_hex(16)
    printed = run_ok(
        sandbox, f"kept = {LEAK + in_code!r}\nimport secrets\nprint('FLOWRL' + 'LEAK' + secrets.token_hex(16))"
    )
    assert printed.startswith(LEAK)
    secret = printed.strip()[len(LEAK) :]
    found = run_ok(sandbox, SCANNER)
    assert secret not in found, "a job read the previous job's stdout out of its worker's memory"
    assert in_code not in found, "a job read the previous job's code out of its worker's memory"


def test_a_job_cannot_read_the_next_queued_jobs_code(sandbox):
    for _ in range(5):  # each round starts on an idle worker, where a host writes two jobs at once
        secret = secrets.token_hex(16)
        victim = f"secret = {LEAK + secret!r}\nprint('victim')"
        results = sandbox.run_many([SCANNER, victim, "print('filler')"])
        assert [r.status for r in results] == ["ok"] * 3, results
        assert results[1].stdout == "victim\n"
        assert secret not in results[0].stdout, "a job read the code of the job queued after it"


@pytest.fixture
def host_socket():
    """A host service on a world-writable unix socket outside the hidden directories."""
    folder = Path("/var/tmp")
    if not folder.is_dir():
        pytest.skip("no /var/tmp on this host to put a world-writable socket in")
    path = folder / f"flowrl-isolation-{uuid.uuid4().hex}.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o777)
    server.listen(5)
    server.setblocking(False)
    try:
        yield path, server
    finally:
        server.close()
        path.unlink(missing_ok=True)


def test_a_host_unix_socket_is_unreachable(sandbox, host_socket):
    path, server = host_socket
    said = run_ok(
        sandbox,
        "import socket\n"
        "client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "try:\n"
        f"    client.connect({str(path)!r})\n"
        "    client.sendall(b'the job data')\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n",
    )
    assert said.startswith("refused"), said
    with pytest.raises(BlockingIOError):
        server.accept()  # nothing arrived
    assert stat.S_ISSOCK(path.stat().st_mode)  # the service is still there on the host


def test_no_unix_socket_is_visible_anywhere(sandbox, host_socket):
    found = run_ok(
        sandbox, "find / \\( -path /proc -o -path /sys \\) -prune -o -type s -print 2>/dev/null; true", "bash"
    )
    assert found == "", f"sockets a job can see: {found.split()}"


def test_the_kernel_keyrings_carry_nothing_between_jobs(sandbox):
    """A uid's keyrings are not in any namespace: every job of every worker would share them."""
    prelude = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    if platform.machine() != "x86_64":
        pytest.skip("the test calls keyctl by its x86_64 syscall numbers")
    added = run_ok(
        sandbox,
        prelude + "key = libc.syscall(248, b'user', b'flowrl-carry', b'left for the next job', 21, -4)\n"
        "print(key, ctypes.get_errno())",
    )
    assert added.split()[0] == "-1", f"a job added a key to its uid's keyring: {added}"
    found = run_ok(sandbox, prelude + "print(libc.syscall(250, 10, -4, b'user', b'flowrl-carry', 0))")
    assert found.strip() == "-1"
    # the same call through the 32-bit entry (int 0x80), which a filter checking only x86_64 numbers misses
    int80 = sandbox.run(
        "import ctypes, mmap\n"
        "code = bytes.fromhex('53' 'B820010000' 'BB00000000' 'B9FCFFFFFF' 'BA00000000' 'CD80' '5B' 'C3')\n"
        "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "m.write(code)\n"
        "print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())\n"
    )  # keyctl(KEYCTL_GET_KEYRING_ID, @u): a key id when it works, -ENOSYS when refused
    assert not (int80.ok and int(int80.stdout) > 0), f"keyctl through int 0x80 worked: {int80}"


def test_a_job_cannot_signal_the_process_that_starts_the_next_job(level):
    """Where jobs share the fork server's uid (not root: one uid in the user namespace; here drop_uid=None), a job
    could kill or stop it (issue 39). The fork server is now init of the PID namespace the jobs run in: the only
    other process a job sees, its parent, and init takes no signal from inside; a SIGKILL or SIGSTOP to any pid
    the job can name does nothing, the job runs its course and the next job starts as usual."""
    with Sandbox(workers=1, isolation=level, drop_uid=None, timeout=3) as sb:  # room to print on a busy machine
        for signal_name in ("SIGKILL", "SIGSTOP"):
            start = time.monotonic()
            result = sb.run(
                "import os, signal, time\n"
                "seen = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
                "print(seen == [1, os.getpid()], os.getppid(), flush=True)\n"
                f"os.kill(os.getppid(), signal.{signal_name})\n"
                "for pid in range(1, 4096):\n"
                "    if pid != os.getpid():\n"
                "        try:\n"
                f"            os.kill(pid, signal.{signal_name})\n"
                "        except OSError:\n"
                "            pass\n"
                "time.sleep(60)"
            )
            assert result.status == "timeout" and result.stdout == "True 1\n", result
            assert time.monotonic() - start < 15
            assert sb.run("print('next')").stdout == "next\n"


def test_a_job_sees_only_its_own_processes_after_one_that_left_daemons(level):
    """After jobs that daemonise children (killed with them), the next job's /proc listed PID 3, the fork server,
    beside itself and PID 1, the zygote that holds every job's code and output (issue 39). Now it sees its
    namespace's init (the fork server, unreachable), itself and its own children."""
    with Sandbox(workers=1, isolation=level, timeout=5) as sb:
        daemons = sb.run(
            "import os, time\n"
            "for _ in range(3):\n"
            "    if os.fork() == 0:\n"
            "        os.setsid()\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(60)\n"
            "        os._exit(0)\n"
            "print(len([p for p in os.listdir('/proc') if p.isdigit()]))"
        )
        assert daemons.ok and int(daemons.stdout) >= 3, daemons  # itself, its init and its daemons
        for _ in range(2):
            seen = sb.run(
                "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, os.getpid()])"
            )
            assert seen.ok and seen.stdout == "True\n", seen
        child = sb.run(
            "import os, subprocess\n"
            "ls = subprocess.Popen(['ls', '/proc'], stdout=subprocess.PIPE, text=True)\n"
            "pids = sorted(int(p) for p in ls.communicate()[0].split() if p.isdigit())\n"
            "print(pids == [1, os.getpid(), ls.pid])"
        )
        assert child.ok and child.stdout == "True\n", child


def test_a_worker_that_cannot_clean_up_after_a_job_is_retired(level, monkeypatch, tmp_path, caplog):
    source = sandbox_module._WORKER_SOURCE.read_text()
    patched = source.replace(
        "    def wipe_ipc(self) -> bool:\n", "    def wipe_ipc(self) -> bool:\n        return False\n", 1
    )
    assert patched != source
    (tmp_path / "sandbox_worker.py").write_text(patched)
    monkeypatch.setattr(sandbox_module, "_WORKER_SOURCE", tmp_path / "sandbox_worker.py")
    caplog.set_level(logging.WARNING, logger="flowrl.rewards.sandbox")
    with Sandbox(workers=1, isolation=level) as sb:
        results = sb.run_many([f"print({i})" for i in range(4)])  # pipelined: queued jobs move to a fresh worker
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]
        assert sum("retiring a worker" in r.getMessage() for r in caplog.records) == 4
        slot = sb._state.slots[0]
        assert sb._ensure_running(slot) is None
        slot.submit("print(5)", "python", 5.0)
        assert slot.collect()["retire"] is True
        slot.proc.wait(timeout=5)  # the worker stops by itself, whatever its host does
