"""The HTML report: one self-contained page plus the PNGs beside it.

Every piece of text that comes from traces or files is escaped: traces hold hostile content.
"""

from __future__ import annotations

from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any

from flowrl.errors import FlowRLError
from flowrl.evaluate.stats import wilson_interval
from flowrl.promote.history import History
from flowrl.report.metrics import EvalFile, EvalGroup, StoreMetrics, TrainingRun
from flowrl.rewards.config import REGISTRY
from flowrl.version import __version__

_CSS = """
body{font-family:-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif;margin:0;background:#f6f7f9;color:#1f2933}
header{background:#1f3a5f;color:#fff;padding:18px 32px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;opacity:.8;font-size:13px}main{max-width:1080px;margin:0 auto;padding:16px 32px 48px}
section{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.08);padding:16px 20px;margin:16px 0}
h2{font-size:16px;margin:0 0 12px}table{border-collapse:collapse;font-size:13px;margin:4px 0 8px}
th,td{padding:5px 10px;border-bottom:1px solid #e4e7eb;text-align:right}th:first-child,td:first-child{text-align:left}
th{background:#f0f2f5;font-weight:600}.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{flex:1;min-width:140px;background:#f0f4fa;border-radius:6px;padding:10px 14px}
.card b{display:block;font-size:22px}.card span{font-size:12px;color:#52606d}
img{max-width:100%;height:auto}.better{color:#1b7f3b;font-weight:600}.worse{color:#b42318;font-weight:600}
.muted{color:#7b8794;font-size:12px}
"""


def _table(head: list[str], rows: list[list[Any]]) -> str:
    th = "".join(f"<th>{escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(v: Any) -> str:
    return "–" if not isinstance(v, (int, float)) else f"{v:.3f}"


def _img(name: str | None, alt: str) -> str:
    return f'<img src="{escape(name)}" alt="{escape(alt)}">' if name else ""


def _delta_cell(base: Any, model: Any) -> str:
    if not isinstance(base, (int, float)) or not isinstance(model, (int, float)):
        return "–"
    d = model - base
    cls = "better" if d > 1e-9 else "worse" if d < -1e-9 else ""
    return f'<span class="{cls}">{d:+.3f}</span>'


def _short(name: object) -> str:
    """The last two parts of a model path ("runs/grpo"), or the name as given (a Hub id)."""
    parts = str(name).rstrip("/").split("/")
    return "/".join(parts[-2:]) if str(name).startswith(("/", ".", "~")) else str(name)


def eval_section(report: dict[str, Any], path: Path, chart: str | None) -> str:
    per = report.get("per_reward") or {}
    judged = {
        n: v
        for n, v in per.items()
        if isinstance(v, dict) and any(isinstance(v.get(k), (int, float)) for k in ("baseline", "model"))
    }
    unjudged = [n for n in per if n not in judged]
    rows = [
        [
            escape(str(name)),
            _fmt(v.get("baseline")),
            _fmt(v.get("model")),
            _delta_cell(v.get("baseline"), v.get("model")),
        ]
        for name, v in judged.items()
    ]
    comb = report.get("combined") or {}
    if isinstance(comb, dict) and comb:
        rows.append(
            [
                "<b>combined</b>",
                _fmt(comb.get("baseline")),
                _fmt(comb.get("model")),
                _delta_cell(comb.get("baseline"), comb.get("model")),
            ]
        )
    title = f"{escape(_short(report.get('baseline') or 'base'))} → {escape(_short(report.get('model') or 'trained'))}"
    source = f" ({report['prompts_source']})" if report.get("prompts_source") else ""
    return (
        f"<h3>{title}</h3><p class='muted'>{escape(str(path))}, {escape(str(report.get('n_prompts', '?')))} "
        f"held-out prompts{escape(source)}</p>"
        + _table(["reward", "base", "trained", "change"], rows)
        + (f"<p class='muted'>could not judge these answers: {escape(', '.join(unjudged))}</p>" if unjudged else "")
        + _img(chart, "eval chart")
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _points(x: float, cls: bool = False) -> str:
    """A difference of rates in percentage points ("+12.7 pts"), coloured when `cls`."""
    text = f"{100 * x:+.1f} pts"
    return f'<span class="{"better" if x > 0 else "worse" if x < 0 else ""}">{text}</span>' if cls else text


SIGNIFICANT = 0.05  # McNemar p below which a difference is drawn better or worse


def _p_cell(c: dict[str, Any]) -> str:
    if c["mcnemar_p"] >= SIGNIFICANT:
        return f'{c["mcnemar_p"]:.3g} <span class="muted">(not significant)</span>'
    cls = "better" if c["diff"] > 0 else "worse" if c["diff"] < 0 else ""
    return f'<span class="{cls}">{c["mcnemar_p"]:.3g}</span>'


def _diff_cell(c: dict[str, Any]) -> str:
    """The difference, coloured only when McNemar's test says it is not luck (p < 0.05)."""
    return _points(c["diff"], cls=c["mcnemar_p"] < SIGNIFICANT)


def success_section(group: EvalGroup, chart: str | None) -> str:
    """Rates with Wilson intervals, the paired comparisons against the base, and whether every figure recomputes."""
    lead = (lambda f: [str(f.round)]) if group.rounds else (lambda f: [])
    head = ["round"] if group.rounds else []
    arm_rows = [
        [
            *lead(f),
            escape(arm),
            s["n"],
            s["successes"],
            _pct(s["rate"]),
            f"[{_pct(s['ci95'][0])}, {_pct(s['ci95'][1])}]",
        ]
        for f in group.files
        for arm, s in f.data["arms"].items()
    ]
    cmp_rows = [
        [
            *lead(f),
            f"{escape(c['b'])} vs {escape(c['a'])}",
            c["both"],
            c["only_a"],
            c["only_b"],
            c["neither"],
            _p_cell(c),
            _diff_cell(c),
            f"[{_points(c['diff_ci95'][0])}, {_points(c['diff_ci95'][1])}]",
        ]
        for f in group.files
        for c in f.data["comparisons"]
    ]
    title = f"{escape(group.title)}: success per round" if group.rounds else escape(group.title)
    html_ = f"<h3>{title}</h3>" + _img(chart, "success rates with 95% intervals")
    html_ += _table([*head, "arm", "n", "successes", "rate", "95% CI (Wilson)"], arm_rows)
    if cmp_rows:
        html_ += _table(
            [
                *head,
                "paired",
                "both",
                "only base",
                "only arm",
                "neither",
                "McNemar exact p",
                "difference",
                "95% CI (bootstrap)",
            ],
            cmp_rows,
        )
    return html_ + _families_section(group, lead, head) + _verified(group.files)


def _families_section(group: EvalGroup, lead: Any, head: list[str]) -> str:
    """Success per task family (those never trained on marked unseen), then the seen and unseen subsets' paired
    comparisons: '' when no file has families."""
    rows = [
        [
            *lead(f),
            escape(family) + (" <b>(unseen)</b>" if figures["unseen"] else ""),
            *[f"{s['successes']}/{s['n']} ({_pct(s['rate'])})" for s in figures["arms"].values()],
        ]
        for f in group.files
        for family, figures in (f.data.get("families") or {}).items()
    ]
    if not rows:
        return ""
    first = next(f for f in group.files if f.data.get("families"))
    names = [  # arms in order; in a series of rounds, "round-2" and "round-3" share the column "round"
        arm.removesuffix(f"-{first.round}") if group.rounds else arm
        for arm in next(iter(first.data["families"].values()))["arms"]
    ]
    html_ = "<h4>Success per task family</h4>" + _table([*head, "family", *map(escape, names)], rows)
    subset_rows = [
        [
            *lead(f),
            subset,
            f"{escape(c['b'])} vs {escape(c['a'])}",
            next(iter(figures["arms"].values()))["n"],
            _p_cell(c),
            _diff_cell(c),
            f"[{_points(c['diff_ci95'][0])}, {_points(c['diff_ci95'][1])}]",
        ]
        for f in group.files
        for subset, figures in (f.data.get("subsets") or {}).items()
        for c in figures["comparisons"]
    ]
    if subset_rows:
        html_ += _table(
            [*head, "families", "paired", "n", "McNemar exact p", "difference", "95% CI (bootstrap)"], subset_rows
        )
    return html_


def _verified(files: list[EvalFile]) -> str:
    bad = [(f, p) for f in files for p in f.problems]
    if not bad:
        return "<p class='muted'>Every figure recomputes from the per-task outcomes.</p>"
    items = "".join(f"<li>{escape(str(f.path))}: {escape(p)}</li>" for f, p in bad[:20])
    return f"<p class='worse'>These figures do not recompute from the per-task outcomes:</p><ul>{items}</ul>"


def _measures(reward: str) -> str:
    entry = REGISTRY.get(reward)
    return entry.measures if entry is not None else ""


def promotions_section(history: History) -> str:
    """Every decision of a promotions.jsonl: what was promoted, refused (and why) or rolled back, each candidate's
    rate with its Wilson 95% interval against the model it had to beat, and what is promoted now."""
    try:
        entries, now = history.entries(), history.current()
    except FlowRLError as exc:
        return f"<h3>{escape(str(history.path))}</h3><p class='worse'>{escape(str(exc))}</p>"
    rows = []
    for e in entries:
        f = e.figures
        action = {"promote": "better", "refuse": "worse"}.get(e.action, "")
        cells: list[Any] = [
            escape(e.time),
            f"<span class='{action}'>{escape(e.action)}</span>",
            escape(_short(e.candidate or "base")),
        ]
        cells.append(escape(_short(e.replaced or "base")))
        if f:
            n = int(f["n"])
            lo, hi = wilson_interval(round(f["rate_candidate"] * n), n)
            d_lo, d_hi = f["diff_ci95"]
            cells += [
                n,
                _pct(f["rate_current"]),
                f"{_pct(f['rate_candidate'])} [{_pct(lo)}, {_pct(hi)}]",
                f"{f['p']:.3g}",
                f"{_points(f['diff'])} [{_points(d_lo)}, {_points(d_hi)}]",
            ]
        else:
            cells += ["", "", "", "", ""]
        cells.append(escape(e.reason))
        rows.append(cells)
    head = ["time", "action", "candidate", "against", "n", "against: rate", "candidate: rate [95% CI]", "McNemar p"]
    head += ["difference [95% CI]", "why"]
    current = escape(_short(now)) if now else "the base model"
    return (
        f"<h3>{escape(str(history.path))}</h3>"
        + (_table(head, rows) if rows else "<p class='muted'>No decision recorded yet.</p>")
        + f"<p>Promoted now: <b>{current}</b></p>"
    )


def render(
    m: StoreMetrics,
    charts: dict[str, str],
    runs: list[tuple[TrainingRun, str | None]],
    evals: list[tuple[Path, dict[str, Any], str | None]],
    success: list[tuple[EvalGroup, str | None]] | None = None,
    promotions: list[History] | None = None,
) -> str:
    combined_mean = sum(m.combined) / len(m.combined) if m.combined else None
    good = sum(v for k, v in m.labels.items() if k.startswith("good"))
    bad = sum(v for k, v in m.labels.items() if k.startswith("bad"))
    cards = "".join(
        f"<div class='card'><b>{escape(str(v))}</b><span>{escape(k)}</span></div>"
        for k, v in [
            ("traces", m.traces),
            ("days", len(m.per_day)),
            ("agents", len(m.per_agent)),
            ("mean combined reward", _fmt(combined_mean)),
            ("good / bad labels", f"{good} / {bad}"),
            ("tool calls", sum(t.calls for t in m.tools.values())),
        ]
    )
    parts = [
        f"<section><h2>Overview</h2><div class='cards'>{cards}</div>"
        f"<p class='muted'>store: {escape(m.root)}; sources: "
        f"{escape(', '.join(f'{k} {v}' for k, v in sorted(m.per_source.items())))}</p></section>"
    ]
    if success:
        parts.append(
            "<section><h2>Held-out success</h2><p class='muted'>Same tasks for every arm. Error bars: Wilson 95% "
            "intervals; McNemar's exact test on the tasks only one arm got right; difference with a paired "
            "bootstrap 95% interval over tasks.</p>" + "".join(success_section(g, c) for g, c in success) + "</section>"
        )
    if promotions:
        parts.append(
            "<section><h2>Promotions</h2><p class='muted'>A candidate replaces the model promoted now only when "
            "McNemar's exact p is below alpha and the paired difference's 95% interval is above 0, on the same "
            "held-out tasks.</p>" + "".join(promotions_section(h) for h in promotions) + "</section>"
        )
    if evals:
        parts.append(
            "<section><h2>Before / after</h2>" + "".join(eval_section(r, p, c) for p, r, c in evals) + "</section>"
        )
    elif not success:
        parts.append(
            "<section><h2>Before / after</h2><p class='muted'>No eval report: run `flowrl eval` and pass its "
            "output dir with --run.</p></section>"
        )
    parts.append(f"<section><h2>Traces per day</h2>{_img(charts.get('per_day'), 'traces per day')}</section>")
    reward_rows = [
        [escape(n), escape(_measures(n)), len(v), m.reward_none[n], _fmt(sum(v) / len(v) if v else None)]
        for n, v in sorted(m.rewards.items())
    ]
    if reward_rows:
        parts.append(
            "<section><h2>Rewards</h2>"
            + _table(["reward", "measures", "scored", "cannot judge", "mean"], reward_rows)
            + _img(charts.get("rewards"), "reward distributions")
            + "</section>"
        )
    else:
        parts.append(
            "<section><h2>Rewards</h2><p class='muted'>No trace is scored yet: run `flowrl score`.</p></section>"
        )
    parts.append(
        "<section><h2>Labels</h2>"
        + _table(["label", "traces"], [[escape(k), v] for k, v in sorted(m.labels.items())])
        + _img(charts.get("labels"), "labels")
        + "</section>"
    )
    tool_rows = [
        [escape(n), s.calls, s.failures, f"{100 * s.failure_rate:.0f}%"]
        for n, s in sorted(m.tools.items(), key=lambda kv: -kv[1].calls)
    ]
    parts.append(
        "<section><h2>Tools</h2>"
        + _table(["tool", "calls", "failures", "failure rate"], tool_rows)
        + _img(charts.get("tools"), "tool usage")
        + "</section>"
    )
    if runs:
        items = []
        for run, chart in runs:
            last = run.steps[-1] if run.steps else {}
            summary = ", ".join(f"{k} {_fmt(last.get(k))}" for k in ("loss", "reward", "kl") if k in last)
            items.append(
                f"<h3>{escape(run.name)}</h3><p class='muted'>{escape(str(run.path))}: {len(run.steps)} logged steps"
                f"{'; last ' + escape(summary) if summary else ''}</p>{_img(chart, 'training curves')}"
            )
        parts.append("<section><h2>Training</h2>" + "".join(items) + "</section>")
    if m.unreadable:
        parts.append(
            "<section><h2>Unreadable files</h2><ul>"
            + "".join(f"<li>{escape(u)}</li>" for u in m.unreadable)
            + "</ul></section>"
        )
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M")
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width'>"
        f"<title>flowrl report</title><style>{_CSS}</style></head><body><header><h1>flowrl report</h1>"
        f"<p>{m.traces} traces · generated {stamp} · flowrl {__version__}</p></header>"
        f"<main>{''.join(parts)}</main></body></html>"
    )
