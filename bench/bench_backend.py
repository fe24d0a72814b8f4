"""New tokens per second of `TransformersBackend` at batch 1 against batched across concurrent agent-like callers,
and of `LlamaCppBackend` (llama.cpp, q8_0 GGUF) on the same conversations.

    python bench/bench_backend.py [--callers 8] [--turns 3] [--max-new-tokens 48] [--temperature 0]
                                  [--omp-passive] [--json FILE]

SmolLM2-135M-Instruct (`flowrl.models.ensure_default_model()`, built once into the model cache), one backend,
one process, both phases on the same conversations:

* `batch 1`: the conversations run one after another (the backend's batch_size set to 1);
* `batched`: `--callers` conversations run at once, each an asyncio task calling `complete` through
  `asyncio.to_thread` as the example agent does; the backend gathers concurrent calls into batches of up to
  `--callers` rows.

* `llama.cpp`: the conversations one after another through `LlamaCppBackend` (skipped when llama-cpp-python is
  not installed; `--no-llama` skips it too). Its replies are the q8_0 model's, so its token count may differ a
  little; compare tokens/s.

A conversation is agent-shaped: the example agent's system prompt and worked example, a task from the demo
suite, then `--turns` model calls, each followed by a tool result and `--tool-ms` of tool time. Greedy by
default, so both phases decode the same replies and the same number of tokens. Reported per phase: new
tokens, wall seconds, new tokens/s, seconds in prefill and in decode steps, mean rows per decode step, and
the load average before and after; then the ratio of the two phases' tokens/s. The machine may be shared:
compare the figures of one run only.

asyncio's default executor has min(32, cores + 4) threads, 6 on a 2-core machine, which would cap the
callers in `complete` at 6; the batched phase gives the loop an executor with one thread per caller.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class _Rows:
    """Wraps the model: records the rows of each prefill and of each decode step, and the time in each."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.prefills: list[int] = []
        self.steps: list[int] = []
        self.prefill_s = self.step_s = 0.0

    def __call__(self, *, input_ids: Any, past_key_values: Any = None, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = self.model(input_ids=input_ids, past_key_values=past_key_values, **kwargs)
        if past_key_values is None:
            self.prefills.append(int(input_ids.shape[0]))
            self.prefill_s += time.perf_counter() - t0
        else:
            self.steps.append(int(input_ids.shape[0]))
            self.step_s += time.perf_counter() - t0
        return out


def conversations(n: int) -> list[list[dict[str, Any]]]:
    from flowrl.demo.agent import FEW_SHOT, SYSTEM_PROMPT
    from flowrl.demo.tasks import TASKS

    return [
        [
            {"role": "system", "content": SYSTEM_PROMPT},
            *FEW_SHOT,
            {"role": "user", "content": TASKS[i % len(TASKS)].query},
        ]
        for i in range(n)
    ]


async def converse(backend: Any, messages: list[dict[str, Any]], turns: int, tool_s: float) -> int:
    """One agent-like run: `turns` model calls, a tool result after each. Returns the new tokens."""
    messages, new_tokens = list(messages), 0
    for turn in range(turns):
        reply = await asyncio.to_thread(backend.complete, messages)
        new_tokens += reply.completion_tokens
        await asyncio.sleep(tool_s)
        messages += [
            {"role": "assistant", "content": reply.text},
            {"role": "user", "content": f"[exec_code result] {17 * (turn + 3)}"},
        ]
    return new_tokens


async def phase(backend: Any, starts: list[list[dict[str, Any]]], *, concurrent: int, turns: int, tool_s: float) -> int:
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=concurrent))
    gate = asyncio.Semaphore(concurrent)

    async def one(messages: list[dict[str, Any]]) -> int:
        async with gate:
            return await converse(backend, messages, turns, tool_s)

    return sum(await asyncio.gather(*(one(m) for m in starts)))


def measure(
    backend: Any, starts: list[list[dict[str, Any]]], *, batch_size: int, turns: int, tool_s: float
) -> dict[str, Any]:
    spy = backend.model = _Rows(backend.model)
    backend.batch_size = batch_size
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    tokens = asyncio.run(phase(backend, starts, concurrent=batch_size, turns=turns, tool_s=tool_s))
    seconds = time.perf_counter() - t0
    backend.model = spy.model
    return {
        "batch_size": batch_size,
        "calls": sum(spy.prefills),
        "new_tokens": tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 2),
        "prefill_rows": spy.prefills,
        "prefill_s": round(spy.prefill_s, 2),
        "decode_s": round(spy.step_s, 2),
        "mean_decode_rows": round(sum(spy.steps) / max(len(spy.steps), 1), 2),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def measure_llama(
    model_dir: Path, starts: list[list[dict[str, Any]]], args: argparse.Namespace, tool_s: float
) -> dict[str, Any]:
    """The conversations one after another through LlamaCppBackend (the GGUF is written first, not timed)."""
    from flowrl.engines.llama_cpp_backend import LlamaCppBackend

    backend = LlamaCppBackend(model_dir, max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    asyncio.run(phase(backend, starts[:1], concurrent=1, turns=1, tool_s=0))  # warm-up
    load_before = os.getloadavg()
    calls: list[float] = []
    complete = backend.complete

    def timed(messages: list[dict[str, Any]]) -> Any:
        t = time.perf_counter()
        try:
            return complete(messages)
        finally:
            calls.append(time.perf_counter() - t)

    backend.complete = timed  # type: ignore[method-assign]
    t0 = time.perf_counter()
    tokens = asyncio.run(phase(backend, starts, concurrent=1, turns=args.turns, tool_s=tool_s))
    seconds = time.perf_counter() - t0
    return {
        "calls": len(calls),
        "new_tokens": tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 2),
        "prefill_rows": [],
        "prefill_s": float("nan"),
        "decode_s": round(sum(calls), 2),
        "mean_decode_rows": 1.0,
        "gguf": backend.gguf.name,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=8, help="concurrent conversations in the batched phase")
    parser.add_argument("--conversations", type=int, help="conversations per phase (default: --callers)")
    parser.add_argument("--turns", type=int, default=3, help="model calls per conversation")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--tool-ms", type=float, default=30, help="simulated tool time after each call")
    parser.add_argument("--max-wait-ms", type=float, default=20)
    parser.add_argument("--omp-passive", action="store_true", help="set OMP_WAIT_POLICY=PASSIVE before torch loads")
    parser.add_argument("--no-llama", action="store_true", help="skip the llama.cpp phase")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.omp_passive:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

    import torch

    from flowrl.engines.transformers_backend import TransformersBackend
    from flowrl.models import ensure_default_model

    model_dir = ensure_default_model()
    backend = TransformersBackend(
        model_dir,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        batch_size=args.callers,
        max_wait_ms=args.max_wait_ms,
    )
    starts = conversations(args.conversations or args.callers)
    print(
        f"model {model_dir.name}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, {os.cpu_count()} cores, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    tool_s = args.tool_ms / 1000
    measure(backend, starts[:1], batch_size=1, turns=1, tool_s=0)  # warm-up
    results = {"batch 1": measure(backend, starts, batch_size=1, turns=args.turns, tool_s=tool_s)}
    results["batched"] = measure(backend, starts, batch_size=args.callers, turns=args.turns, tool_s=tool_s)
    from flowrl.engines.llama_cpp_backend import llama_cpp_available

    if llama_cpp_available() and not args.no_llama:
        results["llama.cpp"] = measure_llama(model_dir, starts, args, tool_s)
    one, many = results["batch 1"], results["batched"]
    print(
        f"{'phase':<9} {'calls':>5} {'new tokens':>10} {'seconds':>8} {'tokens/s':>9} {'prefill s':>9} "
        f"{'decode s':>8} {'rows/step':>9}  load before -> after"
    )
    for name, r in results.items():
        print(
            f"{name:<9} {r['calls']:>5} {r['new_tokens']:>10} {r['seconds']:>8.1f} {r['tokens_per_s']:>9.2f} "
            f"{r['prefill_s']:>9.1f} {r['decode_s']:>8.1f} {r['mean_decode_rows']:>9.2f}  "
            f"{' '.join(map(str, r['load_before']))} -> {' '.join(map(str, r['load_after']))}"
        )
    ratio = many["tokens_per_s"] / one["tokens_per_s"]
    print(f"batched / batch 1: {ratio:.2f}x; rows of each prefill in the batched phase: {many['prefill_rows']}")
    if "llama.cpp" in results:
        fast = results["llama.cpp"]["tokens_per_s"]
        print(
            f"llama.cpp / batch 1: {fast / one['tokens_per_s']:.2f}x; llama.cpp / batched: "
            f"{fast / many['tokens_per_s']:.2f}x"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"results": results, "ratio": round(ratio, 3), "args": vars(args)}, indent=2, default=str)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
