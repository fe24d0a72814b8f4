"""The sandbox: one test per hostile program, each run as the code of a trace through CodeExecutionReward
(reward 0 or None, back within its timeout, the host untouched), plus the sandbox's own contract."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from flowrl.errors import SandboxError
from flowrl.rewards import sandbox_launch
from flowrl.rewards.code_execution import CodeExecutionReward
from flowrl.rewards.sandbox import LANGUAGES, STATUSES, Sandbox
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace

TIMEOUT = 1.5  # per hostile program
SLACK = 3.0  # what a result may take beyond its timeout on a loaded 2-core machine


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(timeout=TIMEOUT, memory_mb=256) as sb:
        yield sb


@pytest.fixture(scope="module")
def reward(sandbox):
    return CodeExecutionReward(timeout=TIMEOUT, sandbox=sandbox)


@pytest.fixture
def namespaced(sandbox):
    if sandbox.isolation == "rlimits":
        pytest.skip("needs namespace isolation (bwrap or unshare); this machine has only rlimits")
    return sandbox


def trace_running(code: str, tool: str = "exec_code", key: str = "code") -> ExecutionTrace:
    return ExecutionTrace(user_query="hostile", tool_calls=[ToolCallTrace(tool_name=tool, arguments={key: code})])


def judge(reward: CodeExecutionReward, code: str, tool: str = "exec_code", key: str = "code"):
    start = time.monotonic()
    result = reward.score(trace_running(code, tool, key))
    elapsed = time.monotonic() - start
    assert result.value in (0.0, None), result.details
    assert elapsed < TIMEOUT + SLACK, f"took {elapsed:.1f} s"
    return result, result.details["blocks"][0]


def assert_pool_works(sandbox: Sandbox) -> None:
    for result in sandbox.run_many(["print('alive')"] * (2 * sandbox.workers)):
        assert result.status == "ok" and result.stdout == "alive\n", result


# -- hostile programs ---------------------------------------------------------------------------------


def test_infinite_loop_times_out(reward):
    _, block = judge(reward, "while True:\n    pass")
    assert block["status"] == "timeout"


def test_sleep_forever_times_out(reward):
    _, block = judge(reward, "sleep 1000", tool="shell", key="command")
    assert block["status"] == "timeout"
    assert block["language"] == "bash"


def test_fork_bomb_is_contained_and_cleaned_up(reward, sandbox):
    before = _processes_of(sandbox.drop_uid if sandbox.drop_uid is not None else os.getuid())
    _, block = judge(reward, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    assert block["status"] in ("timeout", "error", "killed")
    _, block = judge(reward, "bomb() { bomb | bomb & wait; }; bomb", tool="bash", key="command")
    time.sleep(0.2)
    after = _processes_of(sandbox.drop_uid if sandbox.drop_uid is not None else os.getuid())
    assert after <= before + 1, f"{after - before} processes left behind"
    assert_pool_works(sandbox)


def test_memory_bomb_is_stopped(reward):
    _, block = judge(reward, "x = []\nwhile True:\n    x.append(' ' * (32 * 1024 * 1024))")
    assert block["status"] == "oom"
    assert "MemoryError" in block["stderr"]


def test_unbounded_output_is_capped(reward, sandbox):
    _, block = judge(reward, "while True:\n    print('x' * 10000)")
    assert block["status"] in ("killed", "timeout")
    assert block.get("stdout_truncated")
    direct = sandbox.run("import sys\nwhile True:\n    sys.stdout.write('y' * 4096)")
    assert direct.status in ("killed", "timeout")
    assert len(direct.stdout) <= 64 * 1024 and direct.stdout_truncated


def test_cannot_write_into_host_tmp_or_home(reward, namespaced):
    name = f"flowrl-hostile-{uuid.uuid4().hex}"
    home = Path.home()
    targets = [Path("/tmp") / name, home / name, Path("/tmp") / name / "deep"]
    code = (
        "import os\n"
        f"open('/tmp/{name}', 'w').write('pwned')\n"
        f"open(os.path.expanduser('~/{name}.home'), 'w').write('pwned')\n"
        f"open({str(home / name)!r}, 'w').write('pwned')\n"
    )
    try:
        _, block = judge(reward, code)
        assert block["status"] == "error"
        _, block = judge(
            reward, f"echo pwned > /tmp/{name}.sh && echo pwned > {home / name}.sh", tool="bash", key="command"
        )
        for path in [*targets, Path(f"/tmp/{name}.home"), Path(f"/tmp/{name}.sh"), Path(f"{home / name}.sh")]:
            assert not path.exists(), f"{path} appeared on the host"
    finally:
        for path in targets:
            if path.is_file():
                path.unlink()


def test_cannot_connect_to_a_host_listener(reward, namespaced):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'pwned')"
        _, block = judge(reward, code)
        assert block["status"] == "error"
        judge(reward, f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo pwned >&3", tool="bash", key="command")
        with pytest.raises(BlockingIOError):
            server.accept()  # no connection arrived
    finally:
        server.close()


def test_cannot_read_the_host_environment(monkeypatch):
    secret = f"flowrl-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("FLOWRL_TEST_SECRET", secret)
    code = (
        "import os, glob\n"
        "seen = repr(dict(os.environ))\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        seen += open(path, 'rb').read().decode('utf-8', 'replace')\n"
        "    except OSError:\n"
        "        pass\n"
        "print(seen)\n"
        f"assert {secret!r} in seen, 'secret not found'\n"
    )
    with CodeExecutionReward(timeout=TIMEOUT) as fresh:  # a pool started after the secret was set
        if fresh.sandbox.isolation == "rlimits" and os.geteuid() != 0:
            pytest.skip("with rlimits only, a job runs as this uid and may read /proc/<pid>/environ")
        result, block = judge(fresh, code)
        assert result.value == 0.0 and block["status"] == "error"
        assert secret not in block["stdout"] and "FLOWRL_TEST_SECRET" not in block["stdout"]
        _, block = judge(
            fresh, f"env; cat /proc/*/environ 2>/dev/null; env | grep -q {secret}", tool="bash", key="command"
        )
        assert secret not in block["stdout"]


def test_reading_stdin_gets_end_of_file(reward):
    _, block = judge(reward, "data = input()")
    assert block["status"] == "error" and "EOFError" in block["stderr"]
    _, block = judge(reward, 'read line; test -n "$line"', tool="bash", key="command")
    assert block["status"] == "error"


def test_killing_the_parent_leaves_host_and_pool_alive(reward, namespaced):
    judge(
        reward,
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\nraise SystemExit(1)",
    )
    # each program fails unless its attack worked: its parent (the zygote, init of the namespace) survives
    judge(
        reward, "kill -9 -1; kill -9 $PPID; kill -9 1; sleep 0.2; kill -0 $PPID && exit 1", tool="bash", key="command"
    )
    judge(reward, "import os, signal\nos.killpg(0, signal.SIGKILL)")
    assert os.getpid() > 0  # this test process is still here
    assert_pool_works(namespaced)


def test_cannot_forge_a_result_through_the_workers_pipes(reward, sandbox):
    forged = '{"id": %d, "status": "ok", "exit_code": 0, "stdout": "forged"}'
    code = (
        "import os\n"
        "wrote = []\n"
        "for pid in {os.getppid(), 1}:\n"
        "    for fd in range(64):\n"
        "        for n in range(1, 200):\n"
        "            try:\n"
        f"                with open(f'/proc/{{pid}}/fd/{{fd}}', 'w') as f:\n"
        f"                    f.write({forged!r} % n + '\\n')\n"
        "                wrote.append(fd)\n"
        "            except OSError:\n"
        "                break\n"
        "assert wrote, 'could not reach the worker'\n"
    )
    result, block = judge(reward, code)
    assert block["status"] == "error" and "could not reach the worker" in block["stderr"]
    after = sandbox.run_many(["print('genuine')"] * 4)
    assert all(r.stdout == "genuine\n" for r in after), after


# -- the sandbox's contract -----------------------------------------------------------------------------


def test_isolation_is_reported(sandbox):
    assert sandbox.isolation in sandbox_launch.LEVELS
    assert sandbox.run("print(1)").isolation == sandbox.isolation


def test_namespace_isolation_is_real(namespaced):
    code = (
        "import os, socket\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "print(len(pids), sorted(n for _, n in socket.if_nameindex()), os.access('/', os.W_OK))"
    )
    result = namespaced.run(code)
    assert result.ok, result
    visible, rest = result.stdout.split(" ", 1)
    assert int(visible) <= 3  # itself and its zygote (the host has many more)
    assert rest.strip() == "['lo'] False"


def test_systemexit_codes_propagate(sandbox):
    assert sandbox.run("import sys; sys.exit(3)").exit_code == 3
    assert sandbox.run("raise SystemExit(0)").status == "ok"
    assert sandbox.run("raise SystemExit()").status == "ok"
    message = sandbox.run("import sys; sys.exit('bad input')")
    assert message.exit_code == 1 and "bad input" in message.stderr
    assert sandbox.run("exit 4", "bash").exit_code == 4


def test_python_and_bash_snippets_run(sandbox):
    python = sandbox.run("import json\nprint(json.dumps({'a': 1}))")
    assert python.status == "ok" and python.stdout == '{"a": 1}\n' and python.exit_code == 0
    stdlib = sandbox.run("import csv, glob, textwrap, decimal\nprint(textwrap.shorten('a b c d e f', 9))")
    if sandbox.isolation != "rlimits":  # rlimits as root: the host's permissions may hide the stdlib (warned)
        assert stdlib.ok, stdlib  # the whole standard library, not only what the worker preloads
    bash = sandbox.run("echo $((6 * 7)); echo oops >&2", "bash")
    assert bash.status == "ok" and bash.stdout == "42\n" and bash.stderr == "oops\n"
    assert sandbox.run("1/0").status == "error"
    with pytest.raises(ValueError):
        sandbox.run("x", language="cobol")


def test_environment_is_clean_and_home_is_tmp(sandbox):
    result = sandbox.run("import os, json\nprint(json.dumps(dict(os.environ)))\nprint(os.getcwd())")
    env_line, cwd = result.stdout.splitlines()
    env = __import__("json").loads(env_line)
    assert set(env) <= {"PATH", "HOME", "LANG", "TMPDIR", "LC_CTYPE"}
    assert env["HOME"] == "/tmp" and cwd == env["TMPDIR"]


def test_every_job_gets_a_fresh_working_directory(sandbox):
    first = sandbox.run("import os\nopen('left-behind', 'w').write('x')\nprint(os.getcwd())")
    second = sandbox.run("import os\nprint(os.getcwd(), os.listdir('.'))")
    assert first.ok and second.ok
    assert "left-behind" not in second.stdout


def test_unprivileged_when_root(sandbox):
    if os.geteuid() != 0:
        pytest.skip("only root drops to an unprivileged uid")
    result = sandbox.run("import os\nprint(os.getuid(), os.getgid())\nopen('/etc/shadow').read()")
    assert result.stdout.strip() == "65534 65534" and result.status == "error"


def test_limits_file_size_and_open_files():
    with Sandbox(workers=1, timeout=3, max_file_size=1024 * 1024, max_open_files=32) as sb:
        big = sb.run("open('big', 'wb').write(b'x' * (4 * 1024 * 1024))")
        assert big.status == "error" and "File too large" in big.stderr
        files = sb.run("fs = [open('f%d' % i, 'w') for i in range(100)]")
        assert files.status == "error" and "Too many open files" in files.stderr


def test_cpu_time_limit_is_a_timeout():
    with Sandbox(workers=1, timeout=30, cpu_time=1) as sb:  # a long wall limit: the CPU limit must hit first
        result = sb.run("while True:\n    pass")
        assert result.status == "timeout" and "CPU" in (result.reason or ""), result
        assert result.duration < 30


def test_run_many_keeps_order_and_runs_in_parallel(sandbox):
    results = sandbox.run_many([(f"print({i})", "python") for i in range(20)])
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]
    if sandbox.workers >= 2:
        start = time.monotonic()
        sandbox.run_many(["import time; time.sleep(0.5)"] * sandbox.workers)
        assert time.monotonic() - start < 0.5 * sandbox.workers


def test_run_is_thread_safe(sandbox):
    results: list = []

    def worker(i: int) -> None:
        for j in range(5):
            results.append((i, j, sandbox.run(f"print({i} * 100 + {j})").stdout))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 30
    assert all(out == f"{i * 100 + j}\n" for i, j, out in results)


def test_worker_death_is_an_infra_error_then_recovers():
    with Sandbox(workers=1, timeout=5) as sb:
        sb.run("pass")
        slot = sb._state.slots[0]
        threading.Timer(0.3, slot.proc.kill).start()
        result = sb.run("import time; time.sleep(3)")
        assert result.status == "infra_error" and result.error
        assert sb.run("print('back')").stdout == "back\n"
        reward = CodeExecutionReward(sandbox=sb)
        threading.Timer(0.3, lambda: sb._state.slots[0].proc.kill()).start()
        assert reward.score(trace_running("import time; time.sleep(3)")).value is None


def test_queued_jobs_survive_a_worker_death():
    with Sandbox(workers=1, timeout=5) as sb:
        sb.run("pass")
        threading.Timer(0.5, lambda: sb._state.slots[0].proc.kill()).start()
        results = sb.run_many(["import time; time.sleep(3)"] + [f"print({i})" for i in range(5)])
        assert results[0].status == "infra_error"
        assert [r.stdout for r in results[1:]] == [f"{i}\n" for i in range(5)]  # rerun on a fresh worker


def test_workers_are_recycled_after_n_jobs():
    with Sandbox(workers=1, recycle_after=3) as sb:
        pids = []
        for _ in range(7):
            assert sb.run("pass").ok
            pids.append(sb._state.slots[0].proc.pid if sb._state.slots[0].proc else None)
        assert len({p for p in pids if p}) >= 2


def test_close_stops_workers_and_refuses_new_work():
    sb = Sandbox(workers=2)
    sb.run_many(["pass", "pass"])
    procs = [s.proc for s in sb._state.slots if s.proc is not None]
    assert procs
    sb.close()
    sb.close()  # twice is fine
    assert all(p.poll() is not None for p in procs)
    with pytest.raises(SandboxError):
        sb.run("pass")


def test_missing_bwrap_falls_back_loudly(monkeypatch, caplog):
    real_which = sandbox_launch.shutil.which
    monkeypatch.setattr(
        sandbox_launch.shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name)
    )
    caplog.set_level(logging.INFO, logger="flowrl.rewards.sandbox")
    with Sandbox(workers=1) as sb:
        assert sb.isolation in ("unshare", "rlimits")
        assert sb.run("print(2)").stdout == "2\n"
    assert any(r.levelno >= logging.WARNING and sb.isolation in r.getMessage() for r in caplog.records)


def test_broken_bwrap_falls_back_and_require_isolation_refuses(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    real_which = sandbox_launch.shutil.which
    monkeypatch.setattr(
        sandbox_launch.shutil, "which", lambda name, *a, **k: str(fake) if name == "bwrap" else real_which(name)
    )
    with pytest.raises(SandboxError, match="bwrap"):
        Sandbox(workers=1, require_isolation="bwrap").start()
    monkeypatch.setenv("FLOWRL_SANDBOX_REQUIRE", "bwrap")
    with pytest.raises(SandboxError):
        CodeExecutionReward().score(trace_running("print(1)"))
    monkeypatch.delenv("FLOWRL_SANDBOX_REQUIRE")
    with Sandbox(workers=1) as sb:
        assert sb.isolation != "bwrap"


def test_rlimits_only_is_announced_loudly(caplog):
    with Sandbox(workers=1, isolation="rlimits") as sb:
        assert sb.isolation == "rlimits"
        assert sb.run("print(3)").stdout == "3\n"
    assert any("NO NAMESPACE ISOLATION" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_unshare_level_isolates_when_available():
    try:
        sb = Sandbox(workers=1, isolation="unshare").start()
    except SandboxError as exc:
        pytest.skip(f"unshare does not work here: {exc}")
    with sb:
        result = sb.run(
            "import os, socket\nprint(sorted(n for _, n in socket.if_nameindex()), os.access('/', os.W_OK))"
        )
        assert result.stdout.strip() == "['lo'] False"


def test_bad_options_are_refused():
    with pytest.raises(SandboxError):
        Sandbox(isolation="docker")
    with pytest.raises(SandboxError):
        Sandbox(require_isolation="gvisor")
    assert set(STATUSES) >= {"ok", "infra_error"} and LANGUAGES["sh"] == "bash"


def _processes_of(uid: int) -> int:
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                count += os.stat(f"/proc/{name}").st_uid == uid
            except OSError:
                pass
    return count


def test_docs_list_the_real_defaults():
    """docs/sandbox.md's table of options must match Sandbox's signature."""
    import inspect
    import re

    from flowrl.rewards.sandbox import DEFAULT_PRELOAD

    doc = (Path(__file__).resolve().parents[1] / "docs" / "sandbox.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", doc, re.M))
    params = {n: p.default for n, p in inspect.signature(Sandbox).parameters.items()}
    assert set(rows) == set(params), set(rows) ^ set(params)
    for name, default in params.items():
        shown = rows[name]
        if default is DEFAULT_PRELOAD:
            assert shown == "DEFAULT_PRELOAD"
        else:
            assert eval(shown) == default, f"{name}: docs say {shown}, code says {default!r}"  # noqa: S307


def test_a_forked_host_cannot_use_or_stop_the_parents_workers(sandbox):
    assert sandbox.run("print(1)").ok
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked copy of this test process
        code = 1
        try:
            sandbox.run("print(2)")
        except SandboxError:
            code = 0
        sandbox.close()  # must not stop the parent's workers
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sandbox.run("print(3)").stdout == "3\n"


def test_close_while_jobs_run_returns_infra_errors():
    sb = Sandbox(workers=2, timeout=5)
    sb.run_many(["pass", "pass"])
    out: list = []
    runner = threading.Thread(target=lambda: out.extend(sb.run_many(["import time; time.sleep(2)"] * 6)))
    runner.start()
    time.sleep(0.5)
    sb.close()
    runner.join(10)
    assert not runner.is_alive()
    assert len(out) == 6 and all(r.status in ("infra_error", "ok") for r in out)
    assert any(r.status == "infra_error" for r in out)
