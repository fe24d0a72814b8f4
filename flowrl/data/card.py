"""The dataset card (README.md in the output folder), rendered from the build's metadata."""

from __future__ import annotations

from typing import Any

BAR = 40


def histogram_lines(counts: list[int], no_reward: int = 0) -> list[str]:
    """A text histogram of rewards in [0, 1], one line per bin."""
    peak = max(counts) if any(counts) else 1
    width = 1.0 / len(counts)
    lines = []
    for i, n in enumerate(counts):
        lo, hi = i * width, (i + 1) * width
        close = "]" if i == len(counts) - 1 else ")"
        lines.append(f"[{lo:.1f}, {hi:.1f}{close} {'#' * round(BAR * n / peak):<{BAR}} {n}")
    if no_reward:
        lines.append(f"no reward  {no_reward}")
    return lines


def _table(rows: list[tuple[Any, ...]], head: tuple[str, ...]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def _token_budget(stats: dict[str, Any]) -> list[str]:
    budget = stats.get("token_budget")
    if not budget:
        return ["Rows were not measured in tokens (build with `--base-model M` to drop rows over `--max-length`).", ""]
    rows = stats.get("dropped_rows") or []
    lines = [
        f"Token budget: {budget['max_length']} tokens of `{budget['model']}` per sequence; "
        f"rows over it dropped: {len(rows)}.",
        "",
    ]
    if rows:
        lines += _table(
            [(r["split"], ", ".join(r["trace_ids"]), r["tokens"]) for r in rows], ("split", "trace ids", "tokens")
        ) + [""]
    return lines


def render_card(meta: dict[str, Any]) -> str:
    stats = meta["stats"]
    method = meta["method"]
    lines = [
        "---",
        "tags: [flowrl, trl, " + method + "]",
        "---",
        "",
        f"# flowrl {method} dataset",
        "",
        f"Built by flowrl {meta['flowrl_version']} on {meta['created']} from `{meta['store']}`.",
        f"Format: {meta.get('format') or method}. Row format and options: flowrl's docs/datasets.md.",
        "",
        'Load it with `datasets.load_from_disk("<this folder>")`; the same rows are in `data/*.jsonl`.',
        "",
        "## Counts",
        "",
        *_table([(k, v) for k, v in meta["counts"].items()], ("split", "rows")),
        "",
        f"Traces read (after filters): {stats['traces_read']}; used in rows: {stats['traces_used']}; "
        f"unreadable files skipped: {stats['unreadable_files']}.",
        "Conversations synthesised from tool calls (no `messages` on the trace): "
        f"{stats['synthesized_conversations']}; "
        f"traces without tool calls: {stats['traces_without_tool_calls']}.",
        "",
    ]
    if stats["skipped"]:
        lines += ["Traces skipped:", "", *_table(list(stats["skipped"].items()), ("reason", "traces")), ""]
    if stats["groups"]:
        lines += ["Groups (tasks):", "", *_table(list(stats["groups"].items()), ("groups", "count")), ""]
    lines += [
        "## Length budget",
        "",
        f"Budget: {meta['options'].get('max_chars') or 'none'} characters per row. "
        f"Rows truncated at an assistant-turn boundary: {stats['truncated']}; rows dropped as too long: "
        f"{stats['dropped_too_long']}.",
        "",
        *_token_budget(stats),
        "## Label balance",
        "",
    ]
    if stats["labels"]:
        lines += _table(
            [(k, v.get("true", 0), v.get("false", 0)) for k, v in stats["labels"].items()],
            ("split", "desirable (true)", "undesirable (false)"),
        )
        lines.append("")
        if stats["label_sources"]:
            lines.append(
                "Label sources (traces): "
                + ", ".join(f"{k} {v}" for k, v in stats["label_sources"].items())
                + ". A manual label always wins."
            )
            lines.append("")
    tl = stats.get("trace_labels", {})
    lines.append(f"Traces read: {tl.get('true', 0)} good, {tl.get('false', 0)} bad, {tl.get('none', 0)} unlabelled.")
    lines.append("")
    if meta.get("desirable_weight") is not None:
        one_class = not all(v.get("true") and v.get("false") for k, v in stats["labels"].items() if k == "train")
        lines += [
            "## KTO weights",
            "",
            f"`desirable_weight={meta['desirable_weight']}`, `undesirable_weight={meta['undesirable_weight']}`: "
            "computed from the train split's class balance so that "
            "(desirable_weight x n_desirable) / (undesirable_weight x n_undesirable) = sqrt(4/3), inside the "
            "[1, 4/3] range of the KTO paper's Eq. 8. They are also in `flowrl_dataset.json`.",
            "",
        ]
        if one_class:
            lines += ["**Warning:** the train split holds one label only; KTO learns little from it.", ""]
    hist = stats["reward_histogram"]
    lines += [
        "## Reward histogram (traces read)",
        "",
        "```",
        *histogram_lines(hist["counts"], hist["no_reward"]),
        "```",
        "",
    ]
    filters = {k: v for k, v in meta["filters"].items()}
    lines += [
        "## Filters, grouping and split",
        "",
        "Filters: " + (", ".join(f"`{k}={v}`" for k, v in filters.items()) or "none") + ".",
        "",
        "Grouping: " + ", ".join(f"`{k}={v}`" for k, v in meta["grouping"].items()) + ".",
        "",
        f"Split: {meta['splits']['rule']} (val_fraction={meta['splits']['val_fraction']}, "
        f"seed={meta['splits']['seed']}); one task never lands on both sides.",
        "",
        "Builder options: " + ", ".join(f"`{k}={v}`" for k, v in meta["options"].items()) + ".",
        "",
    ]
    return "\n".join(lines)
