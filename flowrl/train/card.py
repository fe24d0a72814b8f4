"""The training card: README.md in the output folder, saying what was trained, on what, how, and how it went."""

from __future__ import annotations

import json
from typing import Any

METRIC_COLUMNS = ("loss", "reward_mean", "reward_std", "kl", "learning_rate", "grad_norm", "tokens_per_s")


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _metrics_table(rows: list[dict[str, Any]], limit: int = 20) -> str:
    steps = [r for r in rows if not r.get("summary")]
    if not steps:
        return "_No training step was logged._"
    columns = [c for c in METRIC_COLUMNS if any(r.get(c) is not None for r in steps)]
    shown = steps if len(steps) <= limit else steps[: limit // 2] + steps[-limit // 2 :]
    lines = ["| step | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for r in shown:
        lines.append(f"| {r['step']} | " + " | ".join(_fmt(r.get(c)) for c in columns) + " |")
    if len(shown) < len(steps):
        lines.append(f"\n({len(steps) - len(shown)} rows in between are in metrics.jsonl)")
    return "\n".join(lines)


def render_training_card(record: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    cfg = record["config"]
    res = record["result"]
    data = record["dataset"]
    settings = res.get("settings", {})
    hardware = res.get("hardware", {})
    lora = cfg.get("lora", {})
    adapter = (
        f"LoRA rank {lora.get('r')}, alpha {lora.get('alpha')}, dropout {lora.get('dropout')}, "
        f"target {lora.get('target_modules')}"
        if lora.get("enabled")
        else "full fine-tuning (no LoRA)"
    )
    if settings.get("load_in_4bit"):
        adapter += ", base loaded in 4 bits (QLoRA)"
    status = "interrupted (Ctrl-C), saved at the last step" if res.get("interrupted") else "finished"
    sps = res.get("seconds_per_step")
    lines = [
        "---",
        "library_name: peft" if lora.get("enabled") else "library_name: transformers",
        "tags: [flowrl, trl, " + cfg["method"] + "]",
        "---",
        "",
        f"# {cfg['method'].upper()} adapter trained with flowrl",
        "",
        f"Trained with flowrl {record['flowrl_version']} on TRL. Status: {status}.",
        "",
        "## Model",
        "",
        f"- base model: `{record['base_model']['spec']}` ({record['base_model']['path']})",
        f"- adapter: {adapter}",
        f"- merged model: `{res['merged_dir']}`"
        if res.get("merged_dir")
        else "- merged model: not requested (`--merge`)",
        "",
        "## Data",
        "",
        f"- dataset: `{data['source']}` ({data['rows']} training rows in the dataset, "
        f"{(res.get('info') or {}).get('rows_trained', data['rows'])} trained after length checks)",
        f"- built for: {data['meta'].get('method', 'unknown')}"
        + (f", by flowrl {data['meta']['flowrl_version']}" if data["meta"].get("flowrl_version") else ""),
    ]
    for key, value in (res.get("info") or {}).items():
        lines.append(f"- {key.replace('_', ' ')}: {json.dumps(value) if not isinstance(value, str) else value}")
    lines += [
        "",
        "## Training",
        "",
        f"- method: {cfg['method']}; steps: {res['start_step']} -> {res['global_step']}"
        + (f" (resumed from step {res['start_step']})" if res["start_step"] else ""),
        f"- hardware: {hardware.get('accelerator', '?')}, profile `{settings.get('profile', '?')}`; precision "
        f"{settings.get('precision')}; gradient checkpointing "
        f"{'on' if settings.get('gradient_checkpointing') else 'off'}",
        f"- batch {settings.get('per_device_train_batch_size')} per device x {settings.get('world_size', 1)} processes "
        f"x accumulation {settings.get('gradient_accumulation_steps')}"
        + (f" = {settings['effective_batch_size']} rows per step" if settings.get("effective_batch_size") else "")
        + (f"; {settings.get('num_generations')} completions per prompt" if cfg["method"].startswith("grpo") else ""),
        f"- time: {res['train_seconds']:.1f} s" + (f", {sps:.2f} s per step" if sps else ""),
        "",
        "## Metrics",
        "",
        _metrics_table(rows),
        "",
        "Every logged step is in `metrics.jsonl`, one JSON object per line.",
        "",
        "## Config",
        "",
        "```json",
        json.dumps(cfg, indent=2, default=str),
        "```",
        "",
        "## Use",
        "",
        "```bash",
        f"flowrl eval --model {res['output_dir']} --prompts {data['source']}",
        "```",
        "",
    ]
    return "\n".join(lines)
