"""`flowrl report`: an HTML page (plus PNGs) about the store, training runs and evaluations."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flowrl.errors import FlowRLError
from flowrl.promote.history import FILE_NAME as PROMOTIONS
from flowrl.promote.history import History
from flowrl.report.metrics import StoreMetrics, find_eval_files, find_runs, group_eval_files, store_metrics
from flowrl.store.files import TraceStore, atomic_write_bytes

__all__ = ["ReportResult", "make_report", "store_metrics", "StoreMetrics"]


@dataclass
class ReportResult:
    html: Path
    pngs: list[Path]
    metrics: StoreMetrics


def make_report(store: TraceStore, out: Path, runs: list[Path] | None = None) -> ReportResult:
    """Write `out/index.html` and its charts. Training/eval dirs in `runs` add curves and the before/after table;
    eval JSON files in `runs` (or `eval.json` in or right below a dir, as `flowrl improve`'s `round-<r>/`) add
    the success rates with their intervals and the paired tests."""
    from flowrl.report import html, plots  # lazy: a package's __init__ imports its modules on first use

    for run in runs or []:  # a folder that adds nothing would give a page that looks complete
        if not any(find_runs([run])) and not find_eval_files([run]) and not (Path(run) / PROMOTIONS).is_file():
            raise FlowRLError(
                f"--run {run}: no metrics.jsonl, eval_report.json, eval JSON or {PROMOTIONS} in it or right below: "
                "pass the output folder of `flowrl train`, `flowrl eval`, `flowrl improve` or `flowrl promote`"
            )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    m = store_metrics(store)
    training, evals = find_runs(list(runs or []))
    charts = plots.store_charts(m, out)
    run_charts = [(r, plots.training_chart(r, out, i)) for i, r in enumerate(training)]
    eval_charts = [(p, r, plots.eval_chart(r, out, i)) for i, (p, r) in enumerate(evals)]
    groups = group_eval_files(find_eval_files(list(runs or [])))
    success = [
        (g, plots.rounds_chart(g.files, out, i) if g.rounds else plots.success_chart(g.files[0], out, i))
        for i, g in enumerate(groups)
    ]
    page = html.render(m, charts, run_charts, eval_charts, success, _histories(store, runs or []))
    index = out / "index.html"
    atomic_write_bytes(index, page.encode("utf-8"))
    return ReportResult(index, sorted(out.glob("*.png")), m)


def _histories(store: TraceStore, runs: list[Path]) -> list[History]:
    """The promotion records to show: promotions.jsonl beside the store (where `flowrl promote` keeps it) and in
    each --run folder (`flowrl improve --promote`'s)."""
    root = getattr(store, "root", None)
    places = ([Path(root).parent] if isinstance(root, Path) else []) + [Path(r) for r in runs]
    found = dict.fromkeys(p.resolve() / PROMOTIONS for p in places if (p / PROMOTIONS).is_file())
    return [History(path) for path in found]
