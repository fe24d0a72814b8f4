"""PNG charts for the report (matplotlib, Agg backend; imported only when a report is made)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowrl.errors import require
from flowrl.report.metrics import EvalFile, StoreMetrics, TrainingRun, round_series

_BLUE, _RED, _GREY = "#3b6fb6", "#c8553d", "#9aa5b1"


def _plt():
    matplotlib = require("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "axes.spines.top": False, "axes.spines.right": False, "font.size": 9})
    return plt


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path)
    _plt().close(fig)
    return path.name


def store_charts(m: StoreMetrics, out: Path) -> dict[str, str]:
    plt = _plt()
    charts: dict[str, str] = {}
    if m.per_day:
        days = sorted(m.per_day)
        fig, ax = plt.subplots(figsize=(6.4, 2.6))
        ax.bar(days, [m.per_day[d] for d in days], color=_BLUE)
        ax.set_title("Traces per day")
        ax.tick_params(axis="x", rotation=45)
        charts["per_day"] = _save(fig, out / "traces_per_day.png")
    names = sorted(m.rewards)
    if names:
        cols = min(3, len(names))
        rows = (len(names) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.3 * rows), squeeze=False)
        for ax in axes.flat[len(names) :]:
            ax.axis("off")
        for ax, name in zip(axes.flat, names):
            ax.hist(m.rewards[name], bins=10, range=(0, 1), color=_BLUE)
            ax.set_title(f"{name} (n={len(m.rewards[name])}, none={m.reward_none[name]})")
        charts["rewards"] = _save(fig, out / "rewards.png")
    if m.labels:
        fig, ax = plt.subplots(figsize=(4.2, 2.4))
        keys = sorted(m.labels)
        colors = [_BLUE if k.startswith("good") else _RED if k.startswith("bad") else _GREY for k in keys]
        ax.barh(keys, [m.labels[k] for k in keys], color=colors)
        ax.set_title("Labels")
        charts["labels"] = _save(fig, out / "labels.png")
    if m.tools:
        tools = sorted(m.tools, key=lambda t: -m.tools[t].calls)[:15]
        fig, ax = plt.subplots(figsize=(6.4, 0.35 * len(tools) + 1.0))
        ok = [m.tools[t].calls - m.tools[t].failures for t in tools]
        bad = [m.tools[t].failures for t in tools]
        ax.barh(tools, ok, color=_BLUE, label="succeeded")
        ax.barh(tools, bad, left=ok, color=_RED, label="failed")
        ax.invert_yaxis()
        ax.legend(loc="lower right", frameon=False)
        ax.set_title("Tool calls")
        charts["tools"] = _save(fig, out / "tools.png")
    return charts


def training_chart(run: TrainingRun, out: Path, index: int) -> str | None:
    keys = [k for k in ("loss", "reward", "kl") if run.series(k)[0]]
    if not keys:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 2.4), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        xs, ys = run.series(key)
        ax.plot(xs, ys, marker="o", markersize=3, color=_BLUE)
        ax.set_title(key)
        ax.set_xlabel("step")
    return _save(fig, out / f"training_{index}.png")


def eval_chart(report: dict[str, Any], out: Path, index: int) -> str | None:
    per = report.get("per_reward") or {}
    names = [
        n
        for n, v in per.items()
        if isinstance(v, dict) and any(isinstance(v.get(k), (int, float)) for k in ("baseline", "model"))
    ]
    if not names:
        return None
    plt = _plt()
    import numpy as np

    x = np.arange(len(names))
    base = [_num(per[n].get("baseline")) for n in names]
    model = [_num(per[n].get("model")) for n in names]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(names) + 1.5), 2.8))
    ax.bar(x - 0.2, base, 0.4, label="base", color=_GREY)
    ax.bar(x + 0.2, model, 0.4, label="trained", color=_BLUE)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylim(0, 1)
    ax.legend(frameon=False)
    ax.set_title("Eval: mean reward per reward")
    return _save(fig, out / f"eval_{index}.png")


def _yerr(figures: list[dict[str, Any]]) -> list[list[float]]:
    """Asymmetric error bars (below, above) from each arm's Wilson interval."""
    return [
        [max(0.0, f["rate"] - f["ci95"][0]) for f in figures],
        [max(0.0, f["ci95"][1] - f["rate"]) for f in figures],
    ]


def rate_top(figures: list[dict[str, Any]]) -> float:
    """The top of a success-rate axis that shows these rates: a little above the highest interval's top, on a
    step of 0.05, at most 1 (rates of a few percent drawn on 0..1 read as zero)."""
    import math

    highest = max((f["ci95"][1] for f in figures), default=1.0)
    return min(1.0, math.ceil((highest * 1.15 + 0.01) / 0.05) * 0.05)


def success_chart(ev: EvalFile, out: Path, index: int) -> str | None:
    """Success rate per arm, with its Wilson 95% interval as error bars."""
    arms = list(ev.data["arms"])
    if not arms:
        return None
    plt = _plt()
    figures = [ev.data["arms"][a] for a in arms]
    fig, ax = plt.subplots(figsize=(max(3.6, 0.9 * len(arms) + 1.8), 2.8))
    ax.bar(
        range(len(arms)),
        [f["rate"] for f in figures],
        0.6,
        yerr=_yerr(figures),
        capsize=4,
        color=[_GREY if a == ev.base else _BLUE for a in arms],
        error_kw={"ecolor": "#1f2933", "lw": 1},
    )
    ax.set_xticks(range(len(arms)), arms, rotation=20 if len(arms) > 3 else 0)
    ax.set_ylim(0, rate_top(figures))
    ax.set_ylabel("success rate")
    ax.set_title(f"Held-out success (n={figures[0]['n']})\nerror bars: 95% Wilson intervals")
    return _save(fig, out / f"success_{index}.png")


def rounds_chart(files: list[EvalFile], out: Path, index: int) -> str | None:
    """Success rate per round for every arm family (base, round, control...), with Wilson 95% error bars."""
    series = round_series(files)
    if not series:
        return None
    plt = _plt()
    base = files[0].base
    colors = iter([_BLUE, _RED, "#2f9e6e", "#8e5ea2", "#d9a03f"])
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    families = sorted(series, key=lambda fam: fam != base)  # base first, then the arms in their file order
    for i, family in enumerate(families):
        points = sorted(series[family], key=lambda p: p[0])
        xs = [r + 0.06 * (i - (len(families) - 1) / 2) for r, _ in points]  # dodge overlapping bars
        figures = [f for _, f in points]
        is_base = family == base
        ax.errorbar(
            xs,
            [f["rate"] for f in figures],
            yerr=_yerr(figures),
            capsize=4,
            marker="o",
            markersize=4,
            linestyle="--" if is_base else "-",
            color=_GREY if is_base else next(colors, _GREY),
            label=family,
        )
    rounds = sorted({f.round or 0 for f in files})
    ax.set_xticks(rounds, [str(r) for r in rounds])
    ax.set_xlim(min(rounds) - 0.5, max(rounds) + 0.5)  # one round: the dodged arms stay side by side
    ax.set_xlabel("round")
    ax.set_ylim(0, rate_top([f for points in series.values() for _, f in points]))
    ax.set_ylabel("success rate")
    ax.legend(frameon=False, fontsize=8)
    n = next(iter(files[0].data["arms"].values()))["n"]
    ax.set_title(f"Held-out success per round (n={n}), 95% Wilson intervals")
    return _save(fig, out / f"success_rounds_{index}.png")


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) else 0.0
