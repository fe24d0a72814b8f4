"""What LLM-client capture adds to an OpenAI SDK call: µs per `client.chat.completions.create`.

    python bench/bench_capture_openai.py [--calls 500] [--rounds 9] [--json out.json]

One process, cases interleaved round by round after a warm-up, median per case. No network:
- `sdk, mock transport`: the SDK's whole call (request building, httpx2 `MockTransport`, response parsing),
  unhooked, then inside a captured run of a hooked agent (every call recorded);
- `sdk, stubbed _post`: the same call with the resource's `_post` replaced by one returning a prebuilt
  `ChatCompletion`, so the SDK's own argument handling stays but transport and parsing go: what is left is
  small enough for capture's share to show through the noise;
- `async, stubbed _post`: the same through `AsyncOpenAI` (`await client.chat.completions.create(...)`);
- `capture wrapper alone`: the SDK takes milliseconds per call here, so its noise hides a few µs. This case
  puts the very wrapper `openai_client` installs on `Completions.create` (`_patch._ClassWrapper` around
  `openai_client._sync_handler`) on a stand-in `create` that returns a prebuilt `ChatCompletion` at once:
  unhooked is the stand-in bare, hooked is the stand-in wrapped, called inside a captured run. This is the
  figure for "µs added per SDK call, network and SDK time aside".

Each hooked round is one run of `--calls` calls (`max_events_per_run` raised to hold them); the writer builds
and writes that run between the timed windows (its cost is `bench_capture.py`'s subject). The request holds
a 6-message conversation (its list is copied on each recorded call). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    import httpx2 as httpx
except ImportError:  # pragma: no cover - an SDK on httpx
    import httpx  # type: ignore[no-redef]

import openai
from openai.types.chat import ChatCompletion

from flowrl.capture import hook_into_agent

REPLY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "bench-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41},
}
MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is 2 + 3?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":3}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "And 3 + 4?"},
]


def _mock_client() -> openai.OpenAI:
    body = json.dumps(REPLY).encode()

    def handler(request: Any) -> Any:
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    return openai.OpenAI(
        api_key="sk-bench",
        base_url="http://bench.invalid/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )


def _stubbed(client: Any) -> Any:
    prebuilt = ChatCompletion.model_validate(REPLY)
    completions = client.chat.completions
    if isinstance(client, openai.AsyncOpenAI):

        async def apost(*args: Any, **kwargs: Any) -> Any:
            return prebuilt

        completions._post = apost
    else:
        completions._post = lambda *args, **kwargs: prebuilt
    return client


class StandIn:
    """`Completions` reduced to a `create` that returns at once (what the wrapper case wraps)."""

    prebuilt = ChatCompletion.model_validate(REPLY)

    def create(self, *, model: str, messages: Any, **kwargs: Any) -> Any:
        return self.prebuilt


class WrappedStandIn(StandIn):
    pass


def _wrap_stand_in() -> None:
    from flowrl.capture import _patch
    from flowrl.capture import openai_client as oc

    live = [True]
    original = vars(StandIn)["create"]
    wrapper = _patch._ClassWrapper(original, oc._sync_handler(oc.CHAT, live), WrappedStandIn, live)
    WrappedStandIn.create = wrapper  # type: ignore[method-assign]


class StandInClient:
    def __init__(self, completions: Any) -> None:
        self.chat = type("Chat", (), {"completions": completions})()


class Agent:
    def __init__(self, client: Any) -> None:
        self.client = client

    def run(self, n: int) -> float:
        create = self.client.chat.completions.create
        t0 = time.perf_counter()
        for _ in range(n):
            create(model="bench-model", messages=MESSAGES)
        return time.perf_counter() - t0

    async def a_run(self, n: int) -> float:
        create = self.client.chat.completions.create
        t0 = time.perf_counter()
        for _ in range(n):
            await create(model="bench-model", messages=MESSAGES)
        return time.perf_counter() - t0


def measure(calls: int, rounds: int) -> dict[str, dict[str, float]]:
    _wrap_stand_in()
    cases = {
        "capture wrapper alone": (lambda: Agent(StandInClient(StandIn())), False),
        "sdk, mock transport": (lambda: Agent(_mock_client()), False),
        "sdk, stubbed _post": (lambda: Agent(_stubbed(openai.OpenAI(api_key="sk-bench"))), False),
        "async, stubbed _post": (lambda: Agent(_stubbed(openai.AsyncOpenAI(api_key="sk-bench"))), True),
    }
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (make, is_async) in cases.items():
            bare, hooked = make(), make()
            if name == "capture wrapper alone":
                hooked = Agent(StandInClient(WrappedStandIn()))
            n = calls * 20 if name == "capture wrapper alone" else calls
            hook = hook_into_agent(
                hooked, store=Path(tmp) / name.replace(" ", "_"), run_methods=["a_run" if is_async else "run"],
                max_events_per_run=n + 10, redact=False,
            )  # fmt: skip

            def once(agent: Agent, n: int, is_async: bool = is_async) -> float:
                return asyncio.run(agent.a_run(n)) if is_async else agent.run(n)

            once(bare, 200)
            once(hooked, 200)
            hook.flush(60)
            times: dict[str, list[float]] = {"bare": [], "hooked": []}
            for _ in range(rounds):
                times["bare"].append(once(bare, n) / n * 1e6)
                times["hooked"].append(once(hooked, n) / n * 1e6)
                hook.flush(60)  # the writer's work, outside the timed windows
            diffs = [h - b for b, h in zip(times["bare"], times["hooked"])]
            out[name] = {
                "bare_us": statistics.median(times["bare"]),
                "hooked_us": statistics.median(times["hooked"]),
                "added_us": statistics.median(diffs),
                "added_min_us": min(diffs),
                "added_max_us": max(diffs),
                "recorded": float(hook.stats.llm_calls),
            }
            hook.unhook()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--calls", type=int, default=500, help="SDK calls per round (one captured run; x20 for the wrapper)"
    )
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    results = measure(args.calls, args.rounds)
    print(f"openai {openai.__version__}, Python {platform.python_version()}, {args.rounds} rounds x {args.calls} calls")
    print()
    print("| case | unhooked µs/call | hooked µs/call | added µs/call (median; min to max of rounds) | recorded |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        print(
            f"| {name} | {r['bare_us']:.2f} | {r['hooked_us']:.2f} | "
            f"{r['added_us']:+.2f} ({r['added_min_us']:+.2f} to {r['added_max_us']:+.2f}) | {int(r['recorded'])} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
