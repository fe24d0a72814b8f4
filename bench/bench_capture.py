"""What live capture costs the host: per-call overhead, and the writer's sustained rate.

    python bench/bench_capture.py [--calls 20000] [--rounds 7] [--seconds 5] [--rate 10000] [--json out.json]

Part 1, per-call overhead (one asyncio loop, one process, cases interleaved round by round after a
warm-up, median per case). Each case awaits `agent.arun_function("search", query="q", k=i)`, a method
that returns a small dict without suspending (the same shape as the reference measurement):
- `bare`: an unpatched class;
- `hooked (generic)`: `hook_into_agent(agent, run_methods=["a_run"], tool_methods=["arun_function"])`,
  the calls made inside one captured run per round (so every call is recorded); the real writer
  builds, masks and writes that run between the timed windows (its cost is Part 2's subject);
- `hooked (FlowAgent adapter)`: the same through the FlowAgent adapter's `arun_function` handler;
- `patched class, other instance`: a hooked class, called on an instance that is not hooked;
- `OpenTelemetry span`: an SDK `start_as_current_span` around the call, `BatchSpanProcessor` with a
  no-op exporter (skipped with a note when `opentelemetry-sdk` is not installed).

Also the cost per captured run (a run with no calls: record, finish, queue).

Part 2, the writer: runs of `--events-per-run` captured tool calls (realistic arguments and results,
some holding secrets; redaction on) at `--rate` events/s for `--seconds`, with the default queue
size; counts drops, the deepest queue seen and how long the final flush took. Then the writer's
ceiling: records queued as fast as possible, timed until written. Then the writer's CPU per trace,
measured on one thread so machine load does not skew it, next to what `TraceStore.write` costs.

Prints markdown tables. Nothing here is a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flowrl.capture import hook_into_agent  # noqa: E402
from flowrl.store.files import TraceStore  # noqa: E402

TARGET_US = 5.0


def make_class(name: str, flowagent: bool = False) -> type:
    """Identical agent classes, so one can be patched while another stays bare."""

    async def arun_function(self, function_name: str, **kwargs: Any) -> dict[str, Any]:
        return {"ok": True, "name": function_name}

    async def a_run(self, n: int, start: int = 0) -> int:
        fn = self.arun_function
        for i in range(start, start + n):
            await fn("search", query="q", k=i)
        return n

    ns: dict[str, Any] = {"arun_function": arun_function, "a_run": a_run}
    if flowagent:  # duck-typed as a toolboxv2 FlowAgent, with an engine
        ns["_get_execution_engine"] = lambda self: _Engine(self)
    return type(name, (), ns)


class _Engine:
    def __init__(self, agent: Any) -> None:
        self.agent = agent

    async def _execute_tool_call(self, ctx: Any, tool_call: Any) -> tuple[str, bool]:  # pragma: no cover
        return "", False


async def drive(agent: Any, n: int, inside_run: bool) -> float:
    """Seconds per call for n awaited calls (inside one captured run when `inside_run`)."""
    if inside_run:
        t0 = time.perf_counter()
        await agent.a_run(n)
        return (time.perf_counter() - t0) / n
    fn = agent.arun_function
    t0 = time.perf_counter()
    for i in range(n):
        await fn("search", query="q", k=i)
    return (time.perf_counter() - t0) / n


def otel_agent() -> tuple[Any, Any] | None:
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    except ImportError:
        return None

    class NoopExporter(SpanExporter):
        def __init__(self) -> None:
            self.count = 0

        def export(self, spans: Any) -> SpanExportResult:
            self.count += len(spans)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NoopExporter()))
    tracer = provider.get_tracer("bench")
    cls = make_class("OtelAgent")
    inner = cls.arun_function

    async def arun_function(self, function_name: str, **kwargs: Any) -> dict[str, Any]:
        with tracer.start_as_current_span(f"execute_tool {function_name}"):
            return await inner(self, function_name, **kwargs)

    cls.arun_function = arun_function
    return cls(), provider


def part1(calls: int, rounds: int, store_root: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    bare = make_class("BareAgent")()
    generic_agent = make_class("GenericAgent")()
    other = type(generic_agent)()  # same (patched) class, not hooked
    fa_agent = make_class("FlowLikeAgent", flowagent=True)()
    hooks = [
        hook_into_agent(
            generic_agent,
            store=store_root / "generic",
            run_methods=["a_run"],
            tool_methods=["arun_function"],
            max_events_per_run=calls + 10,
        ),
        hook_into_agent(
            fa_agent,
            store=store_root / "flowagent",
            adapter="flowagent",
            run_methods=["a_run"],
            max_events_per_run=calls + 10,
        ),
    ]
    cases: dict[str, tuple[Any, bool]] = {
        "bare await": (bare, False),
        "hooked (generic adapter), inside a run": (generic_agent, True),
        "hooked (FlowAgent adapter), inside a run": (fa_agent, True),
        "patched class, instance not hooked": (other, False),
    }
    otel = otel_agent()
    if otel is not None:
        cases["OpenTelemetry SDK span + BatchSpanProcessor"] = (otel[0], False)
    samples: dict[str, list[float]] = {name: [] for name in cases}

    async def main() -> None:
        for agent, inside in cases.values():  # warm-up
            await drive(agent, min(calls, 2000), inside)
        for _ in range(rounds):
            for name, (agent, inside) in cases.items():
                for hook in hooks:  # the writer works between the timed windows, not during them
                    await asyncio.to_thread(hook.flush, 300)
                samples[name].append(await drive(agent, calls, inside))

    asyncio.run(main())
    for hook in hooks:
        hook.flush(60)
    stats = {h.agent_name: h.stats.as_dict() for h in hooks}
    for hook in hooks:
        hook.unhook()
    if otel is not None:
        otel[1].shutdown()
    base = statistics.median(samples["bare await"])
    rows = []
    for name, values in samples.items():
        med = statistics.median(values)
        rows.append(
            {
                "case": name,
                "us_per_call": med * 1e6,
                "added_us": (med - base) * 1e6,
                "ratio_to_bare": med / base,
                "spread_us": (max(values) - min(values)) * 1e6,
            }
        )
    extra = {"otel": otel is not None, "hook_stats": stats}
    return rows, extra


# -- part 2: the writer --------------------------------------------------------------------------

SECRETS = ["sk-proj-" + "Q7fZ2kLm9XwP4tRv8YbN3cHs6JdE1gUa", "ghp_" + "A" * 36, "AKIA" + "ABCDEFGHIJKLMNOP"]


class ToolAgent:
    """A generic agent: each run makes `k` tool calls with realistic arguments and results."""

    def __init__(self, k: int) -> None:
        self.k = k

    async def a_run(self, query: str, session_id: str = "default") -> str:
        for i in range(self.k):
            await self.call_tool(
                "search_docs",
                {"query": f"{query} part {i}", "limit": 5, "api_key": SECRETS[i % 3] if i % 4 == 0 else None},
            )
        return f"Answer for {query}: " + "lorem ipsum dolor sit amet " * 8

    async def call_tool(self, name: str, args: dict[str, Any]) -> str:
        return (
            "Found 5 documents. "
            + "The quick brown fox jumps over the lazy dog. " * 6
            + (f"token={SECRETS[args['limit'] % 3]}" if args.get("api_key") else "")
        )


async def paced(agent: ToolAgent, hook: Any, rate: float, seconds: float) -> dict[str, Any]:
    runs_per_s = rate / agent.k
    total = int(runs_per_s * seconds)
    t0 = time.perf_counter()
    max_depth = 0
    for i in range(total):
        due = t0 + i / runs_per_s
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await agent.a_run(f"question {i}", session_id=f"s{i % 8}")
        max_depth = max(max_depth, hook.queued)
    elapsed = time.perf_counter() - t0
    return {
        "runs": total,
        "events": total * agent.k,
        "elapsed_s": elapsed,
        "achieved_events_per_s": total * agent.k / elapsed,
        "max_queue_depth": max_depth,
    }


def part2(rate: float, seconds: float, events_per_run: int, root: Path) -> dict[str, Any]:
    agent = ToolAgent(events_per_run)
    hook = hook_into_agent(agent, store=root / "paced", run_methods=["a_run"], tool_methods=["call_tool"])
    result = asyncio.run(paced(agent, hook, rate, seconds))
    t = time.perf_counter()
    flushed = hook.flush(120)
    result["final_flush_s"] = time.perf_counter() - t
    result["flushed"] = flushed
    result["stats"] = hook.stats.as_dict()
    hook.unhook()
    # the ceiling: queue everything at once, time until written
    agent = ToolAgent(events_per_run)
    n_runs = max(200, int(rate * 2 / events_per_run))
    hook = hook_into_agent(
        agent, store=root / "ceiling", run_methods=["a_run"], tool_methods=["call_tool"], queue_size=n_runs + 10
    )

    async def burst() -> float:
        t0 = time.perf_counter()
        for i in range(n_runs):
            await agent.a_run(f"question {i}")
        return time.perf_counter() - t0

    loop_s = asyncio.run(burst())
    t0 = time.perf_counter() - loop_s
    hook.flush(300)
    total_s = time.perf_counter() - t0
    result["ceiling"] = {
        "runs": n_runs,
        "events": n_runs * events_per_run,
        "loop_s": loop_s,
        "written": hook.stats.written,
        "traces_per_s": hook.stats.written / total_s,
        "events_per_s": hook.stats.written * events_per_run / total_s,
    }
    result["stored_files"] = TraceStore(root / "paced").count()
    hook.unhook()
    return result


def writer_cpu(events_per_run: int, runs: int, root: Path) -> dict[str, float]:
    """CPU time of the writer's own steps per trace, measured on one thread (independent of load):
    build, mask, rebuild messages, validate, serialise. The store's write (fsync) is reported apart."""
    from flowrl.capture.assemble import build_trace, complete_trace
    from flowrl.capture.masking import redact_trace
    from flowrl.store.files import dumps
    from flowrl.trace.load import load_trace

    agent = ToolAgent(events_per_run)
    hook = hook_into_agent(agent, store=root / "cpu", run_methods=["a_run"], tool_methods=["call_tool"])
    records: list[Any] = []
    hook.registration.submit = lambda record: records.append(record) or True  # keep them for timing

    async def produce() -> None:
        for i in range(runs):
            await agent.a_run(f"question {i}")

    asyncio.run(produce())
    redactor, store = hook.registration.redactor, hook.store
    t = time.thread_time()
    traces = [load_trace(complete_trace(redact_trace(redactor, build_trace(r)))) for r in records]
    for trace in traces:
        dumps(trace)
    python_s = (time.thread_time() - t) / len(records)
    t, w = time.thread_time(), time.perf_counter()
    for trace in traces[:200]:
        store.write(trace)
    write_cpu_s = (time.thread_time() - t) / min(200, len(traces))
    write_wall_s = (time.perf_counter() - w) / min(200, len(traces))
    hook.unhook()
    return {
        "python_ms_per_trace": python_s * 1e3,
        "python_us_per_event": python_s * 1e6 / events_per_run,
        "store_write_cpu_ms": write_cpu_s * 1e3,
        "store_write_wall_ms": write_wall_s * 1e3,
    }


def run_overhead(rounds: int, root: Path, n: int = 3000) -> dict[str, float]:
    """Per captured run: starting the record, finishing it and queueing it (a run with no calls)."""
    bare, hooked = make_class("BareRunAgent")(), make_class("HookedRunAgent")()
    hook = hook_into_agent(hooked, store=root / "runs", run_methods=["a_run"], queue_size=n * rounds + 10)
    samples: dict[str, list[float]] = {"bare": [], "hooked": []}

    async def main() -> None:
        for _ in range(rounds):
            for name, agent in (("bare", bare), ("hooked", hooked)):
                t0 = time.perf_counter()
                for _ in range(n):
                    await agent.a_run(0)
                samples[name].append((time.perf_counter() - t0) / n)

    asyncio.run(main())
    hook.flush(300)
    hook.unhook()
    return {k: statistics.median(v) * 1e6 for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=10000, help="calls per case per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rate", type=float, default=10000.0, help="events/s offered to the writer")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--events-per-run", type=int, default=10)
    ap.add_argument(
        "--store-dir",
        type=Path,
        default=None,
        help="where the bench's stores go (default: a temp dir; /dev/shm takes the disk out of it)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
    with tempfile.TemporaryDirectory(prefix="flowrl-bench-capture-", dir=args.store_dir) as tmp:
        root = Path(tmp)
        rows, extra = part1(args.calls, args.rounds, root)
        print(f"\n## Per-call overhead ({args.calls} calls x {args.rounds} rounds, interleaved, median)\n")
        print("| case | µs/call | added vs bare (µs) | ratio to bare | spread (µs) |")
        print("|---|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['case']} | {r['us_per_call']:.2f} | {r['added_us']:+.2f} | "
                f"{r['ratio_to_bare']:.2f}x | {r['spread_us']:.2f} |"
            )
        if not extra["otel"]:
            print(
                "\nopentelemetry-sdk is not installed: the OpenTelemetry row is skipped "
                "(`pip install opentelemetry-sdk` into the venv to add it)."
            )
        hooked = [r for r in rows if r["case"].startswith("hooked")]
        worst = max(r["added_us"] for r in hooked)
        print(
            f"\ntarget: < {TARGET_US:.0f} µs added per captured call: {'met' if worst < TARGET_US else 'MISSED'} "
            f"(worst {worst:.2f} µs)"
        )
        ro = run_overhead(args.rounds, root)
        print(
            f"\nper captured run (record, finish, queue; a run with no calls): bare {ro['bare']:.2f} µs, "
            f"hooked {ro['hooked']:.2f} µs, added {ro['hooked'] - ro['bare']:+.2f} µs"
        )
        w = part2(args.rate, args.seconds, args.events_per_run, root)
        st = w["stats"]
        print(f"\n## Writer, redaction on ({args.events_per_run} captured tool calls per run, default queue)\n")
        print("| measure | value |")
        print("|---|---:|")
        print(f"| offered | {args.rate:,.0f} events/s for {args.seconds:.0f} s |")
        print(f"| achieved | {w['achieved_events_per_s']:,.0f} events/s ({w['runs']} runs, {w['events']} events) |")
        print(f"| dropped runs | {st['dropped']} |")
        print(f"| written traces | {st['written']} (errors {st['errors']}) |")
        print(f"| deepest queue | {w['max_queue_depth']} runs |")
        print(f"| final flush | {w['final_flush_s'] * 1000:.0f} ms |")
        print(f"| secrets masked | {st['secrets_masked']} |")
        c = w["ceiling"]
        print(
            f"| writer ceiling | {c['events_per_s']:,.0f} events/s = {c['traces_per_s']:,.0f} traces/s "
            f"({c['runs']} runs queued at once) |"
        )
        cpu = writer_cpu(args.events_per_run, 500, root)
        print(
            f"| writer CPU, Python steps (build, mask, validate, serialise) | "
            f"{cpu['python_ms_per_trace']:.3f} ms/trace "
            f"= {cpu['python_us_per_event']:.1f} µs/event |"
        )
        print(
            f"| TraceStore.write (atomic + fsync) | {cpu['store_write_wall_ms']:.2f} ms wall, "
            f"{cpu['store_write_cpu_ms']:.2f} ms CPU per trace |"
        )
        w["writer_cpu"] = cpu
        ok = st["dropped"] == 0 and st["errors"] == 0 and w["flushed"]
        print(f"\ntarget: no drops at {args.rate:,.0f} events/s: {'met' if ok else 'MISSED'}")
        if args.json:
            args.json.write_text(
                json.dumps({"per_call": rows, "per_run_us": ro, "writer": w, **extra}, indent=2, default=str)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
