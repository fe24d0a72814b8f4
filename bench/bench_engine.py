"""The policy engine: new tokens per second of whole example-agent runs with 1, 2, 4 and 8 runs at once on
llama-server (`flowrl.serve.policies.PolicyServer`, what `flowrl improve` and `flowrl eval` use), against
today's `LlamaCppBackend` (llama-cpp-python in-process, one sequence at a time) on the same tasks, in one run;
and the time to load an adapter beside the base model.

    python bench/bench_engine.py [--tasks 48] [--concurrency 1,2,4,8] [--temperature 0] [--json FILE]

SmolLM2-135M-Instruct, q8_0 (the GGUF flowrl writes), 2 threads on this machine. Each phase runs the example
agent's whole loop (its tools executed in the sandbox) on the same `--tasks` tasks of the generated suite;
new tokens are the agent's own count of completion tokens; greedy by default, so phases decode nearly the same
replies. The baseline phase runs first and last and its mean is the one compared (the machine may be shared:
compare the figures of one run only). The adapter swap: a LoRA (r 16, every linear layer, as `flowrl train`
makes) written as a GGUF LoRA, then `LlamaServer.set_adapters` (a restart with the new `--lora` list), 3 times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _phase(name: str, agent: Any, tasks: list[Any], concurrency: int) -> dict[str, Any]:
    from flowrl.demo.example_agents import example_grade
    from flowrl.evaluate.agent import run_tasks

    before_tokens, load = agent.total_tokens_out, _load()
    started = time.perf_counter()
    outcomes = asyncio.run(run_tasks(agent, tasks, example_grade, concurrency=concurrency))
    wall = time.perf_counter() - started
    tokens = agent.total_tokens_out - before_tokens
    row = {
        "phase": name,
        "concurrency": concurrency,
        "new_tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1),
        "right": sum(outcomes.values()),
        "load_before": load,
        "load_after": _load(),
    }
    print(json.dumps(row), flush=True)
    return row


def _random_adapter(model_dir: Path, out: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False))
    peft.save_pretrained(str(out))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=48)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from flowrl.demo.agent import ExampleAgent
    from flowrl.demo.example_agents import ExampleAgents, example_tasks
    from flowrl.engines.llama_cpp_backend import LlamaCppBackend, gguf_for
    from flowrl.engines.lora_gguf import BESIDE, write_lora_gguf
    from flowrl.models import resolve_model
    from flowrl.serve.policies import PolicyServer

    model_dir = Path(resolve_model("smollm2-135m").path)
    gguf = gguf_for(model_dir)
    tasks, _ = example_tasks(args.tasks, 0)
    rows: list[dict[str, Any]] = []
    with ExampleAgents() as agents:
        baseline = LlamaCppBackend(
            model_dir, gguf=gguf, max_new_tokens=agents.max_new_tokens, temperature=args.temperature
        )
        local = ExampleAgent(baseline, sandbox=agents._sandbox)
        rows.append(_phase("LlamaCppBackend", local, tasks, 1))
        with PolicyServer(str(model_dir), engine="llama-server", slots=8) as server:
            agent = agents(server.policy("bench", None, temperature=args.temperature))
            for c in (int(x) for x in args.concurrency.split(",")):
                rows.append(_phase("llama-server", agent, tasks, c))
        rows.append(_phase("LlamaCppBackend", local, tasks, 1))
    base_rate = sum(r["tokens_per_s"] for r in rows if r["phase"] == "LlamaCppBackend") / 2
    for r in rows:
        r["vs_LlamaCppBackend"] = round(r["tokens_per_s"] / base_rate, 2)

    swaps: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as scratch, PolicyServer(str(model_dir), engine="llama-server") as server:
        for k in range(3):
            adapter = _random_adapter(model_dir, Path(scratch) / f"adapter-{k}")
            started = time.perf_counter()
            write_lora_gguf(adapter, model_dir, adapter / BESIDE)
            written = time.perf_counter() - started
            server.policy(f"round-{k}", adapter, temperature=0.0)
            swaps.append({"write_gguf_s": round(written, 2), "load_s": round(server.swap_seconds[-1], 2)})
            print(json.dumps(swaps[-1]), flush=True)
    print(f"{'phase':<16} {'runs at once':>12} {'new tokens':>10} {'wall s':>7} {'tok/s':>7} {'x base':>7}")
    for r in rows:
        print(
            f"{r['phase']:<16} {r['concurrency']:>12} {r['new_tokens']:>10} {r['wall_s']:>7} "
            f"{r['tokens_per_s']:>7} {r['vs_LlamaCppBackend']:>7}"
        )
    print("adapter swap (write GGUF LoRA + load beside the base):", swaps)
    if args.json:
        args.json.write_text(json.dumps({"phases": rows, "swaps": swaps, "tasks": args.tasks}, indent=2))


if __name__ == "__main__":
    main()
