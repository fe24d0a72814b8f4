"""DatasetPipeline: stream a store (or a list of traces) through a builder into a dataset on disk.

One pass reads the store trace by trace (filters, deduplication, conversation, group id). A streaming
builder (KTO) turns each trace into rows right away; a grouped builder (GRPO, SFT, DPO) keeps a small
`TraceInfo` per trace and, after the pass, loads again only the traces each group's rows need. Rows go
to a spool file per split, so memory stays bounded by the number of traces times a few dozen bytes,
not by their size. Embedding grouping adds a first pass that reads only the user turns.

Every trace is decided once, by one path (`DatasetPipeline._decide` over its `flowrl.trace.row.DecisionRow`: the
skip reasons, dedupe, counts and task key): the row is computed from the trace when it is read whole, and read from
a segment's columns (`flowrl.data.columnar`) for a builder that makes its rows from them (`DatasetBuilder.columnar`:
KTO's `column_rows`), so neither parses a trace.

Output folder (`build`):
- `dataset_dict.json`, `train/`, `validation/`: a `datasets.DatasetDict` (`datasets.load_from_disk(out)`);
  a split with no rows is left out;
- `data/{split}.jsonl` (and `data/{split}.parquet` with `parquet=True`), same rows, same order;
- `README.md`: the dataset card; `flowrl_dataset.json`: method, counts, KTO weights, splits, filters.
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import orjson

from flowrl.data import columnar
from flowrl.data.base import BuildStats, DatasetBuilder, DatasetFilter, Kept, RowContext, TraceInfo
from flowrl.data.card import render_card
from flowrl.data.columnar_kto import Pending
from flowrl.data.dedupe import SeenKeys
from flowrl.data.encode import row_trace_ids
from flowrl.data.grouping import Embedder, GroupBy, Grouper
from flowrl.data.sinks import DiskSink, MemorySink
from flowrl.data.split import SPLITS, TRAIN, VALIDATION, check_fraction, split_for
from flowrl.data.workers import HEAVY, SegmentTask, Workers
from flowrl.errors import ConfigError, FlowRLError, SchemaError
from flowrl.store.files import ReadProblem
from flowrl.store.source import TraceSource
from flowrl.trace.conversation import Conversation, trace_conversation
from flowrl.trace.row import DecisionRow, decision_row
from flowrl.trace.schema import ExecutionTrace
from flowrl.version import __version__

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int | None], None]
OUTPUT_NAMES = ("dataset_dict.json", *SPLITS, "data", "README.md", "flowrl_dataset.json", ".flowrl-build")
METADATA_FILE = "flowrl_dataset.json"
TASK_CACHE = 65536


class DatasetError(FlowRLError):
    """A dataset cannot be built from what the store holds."""


@dataclass
class BuildResult:
    """What `DatasetPipeline.build` wrote and counted."""

    out: Path
    method: str
    counts: dict[str, int]
    stats: BuildStats
    metadata: dict[str, Any]
    elapsed_s: float = 0.0
    problems: list[ReadProblem] = field(default_factory=list)

    def summary_lines(self) -> list[str]:
        s = self.stats
        lines = [
            f"{self.method} dataset: "
            + ", ".join(f"{n} {k} rows" for k, n in self.counts.items())
            + f" from {s.traces_used} of {s.traces_read} traces -> {self.out}"
        ]
        if s.labels:
            lines.append(
                "labels: "
                + "; ".join(f"{k} {v.get('true', 0)} good / {v.get('false', 0)} bad" for k, v in s.labels.items())
            )
        if self.metadata.get("desirable_weight") is not None:
            lines.append(
                f"KTO weights: desirable_weight={self.metadata['desirable_weight']} "
                f"undesirable_weight={self.metadata['undesirable_weight']}"
            )
        if s.truncated or s.dropped_too_long:
            lines.append(f"length budget: {s.truncated} rows truncated, {s.dropped_too_long} rows dropped as too long")
        if s.token_budget:
            lines.append(
                f"token budget: {s.token_budget['max_length']} tokens of {s.token_budget['model']}; "
                f"{len(s.dropped_rows)} rows over it dropped (each listed in the card)"
            )
        dropped = {k: v for k, v in s.groups.items() if k != "used"}
        if s.groups:
            lines.append(f"groups: {s.groups.get('used', 0)} used" + "".join(f", {v} {k}" for k, v in dropped.items()))
        for reason, n in s.skipped.items():
            lines.append(f"skipped {n} traces: {reason}")
        if s.unreadable:
            lines.append(f"{s.unreadable} unreadable files skipped")
        return lines


class _Source:
    """A store or an in-memory list of traces, read with the filters; `load(ref)` reads a trace again."""

    def __init__(self, source: TraceSource | Iterable[ExecutionTrace], filters: DatasetFilter, stats: BuildStats):
        # a store (either layout: `TraceSource`); anything else is an iterable of traces
        self.store: TraceSource | None = source if isinstance(source, TraceSource) else None
        self.traces = None if self.store is not None else list(cast(Iterable[ExecutionTrace], source))
        self.flt = filters.trace_filter()
        self.stats = stats
        self.columnar = False
        self.columns: list[str] = []  # what a columnar scan reads besides the scalar columns

    def operation(self) -> Any:
        import contextlib

        return self.store.operation() if self.store is not None else contextlib.nullcontext([])

    def describe(self) -> str:
        return str(self.store.root) if self.store is not None else f"{len(self.traces or [])} traces given in memory"

    def total(self) -> int:
        if self.store is not None:
            return self.store.count_paths(self.flt)
        return len(self.traces or [])

    def scan(self) -> Iterator[tuple[Any, ExecutionTrace]]:
        """`(ref, trace)` per trace in order, ref None when the filters rule it out (or it cannot be read); from a
        columnar scan also stretches of rows decided from their columns (`flowrl.data.columnar.Decided`)."""
        if self.store is None:
            for i, trace in enumerate(self.traces or []):
                if self.flt.day_ok(trace.date()) and self.flt.matches(trace):
                    yield i, trace
                else:
                    yield None, trace
            return
        if self.columnar:
            for item in columnar.items(self.store, self.flt, self.columns):
                if isinstance(item, columnar.Decided):
                    yield item  # type: ignore[misc]  # a stretch of rows: `DatasetPipeline._run` tells them apart
                    continue
                ref, view = item
                if view is None:
                    self.stats.read_whole += 1
                    yield self._read(ref, None)
                else:  # a patched row the filters rule out
                    yield None, view  # type: ignore[misc]
            return
        # which traces have host outcomes, listed once (as `iter_traces` does): not one lookup per trace file
        outcome_ids = self.store.listed_outcomes()
        for path in self.store.iter_paths(self.flt):
            yield self._read(path, outcome_ids)

    def _read(self, path: Any, outcome_ids: set[str] | None) -> tuple[Any, ExecutionTrace]:
        assert self.store is not None
        try:
            trace = self.store.read_path(path, outcome_ids=outcome_ids)
        except SchemaError as exc:
            if self.store.problems.add(ReadProblem(path, str(exc))):  # a file read twice counts once
                self.stats.unreadable += 1
                log.warning("flowrl: skipping %s", exc)
            return None, None  # type: ignore[return-value]  # still one file done, for the progress bar
        return (path, trace) if self.flt.matches(trace) else (None, trace)

    def load(self, ref: Any) -> ExecutionTrace:
        return self.store.read_path(ref) if self.store is not None else self.traces[ref]  # type: ignore[index]


class DatasetPipeline:
    """Runs one builder over a store with filters, grouping, deduplication and the train/validation split."""

    def __init__(  # noqa: PLR0913  # keyword-only options of a dataset build
        self,
        builder: DatasetBuilder,
        *,
        filters: DatasetFilter | None = None,
        group_by: GroupBy = "query",
        similarity: float = 0.9,
        embedding_model: str | None = None,
        embedder: Embedder | None = None,
        val_fraction: float = 0.1,
        seed: int = 0,
        budget: Any = None,
        workers: int = 1,
    ) -> None:
        """`budget` (a `flowrl.data.encode.TokenBudget`) measures rows in the target model's tokens: rows over
        its `max_length` are dropped, each one listed in the card and `flowrl_dataset.json`. `workers` > 1: a
        columnar KTO build makes its rows in that many more processes (`flowrl.data.workers`); any other build
        says so once and runs in this one."""
        if workers < 1:
            raise ConfigError(f"workers {workers}: use 1 or more processes")
        self.workers = workers
        self.worker_peaks: dict[int, float | None] = {}  # MiB, by worker, after a build with workers
        self._pool_now: Workers | None = None
        self._tasks: dict[str, tuple[str, str]] = {}  # raw task key -> (group id, split)
        self.builder = builder
        self.method = getattr(builder, "method_name", None) or builder.method
        self.budget = budget
        self.filters = filters or DatasetFilter()
        self.grouper = Grouper(group_by, similarity, embedding_model, embedder)
        self.val_fraction = check_fraction(val_fraction)
        self.seed = seed
        self.stats = BuildStats()
        if budget is not None:
            self.stats.token_budget = {"model": budget.renderer.model, "max_length": budget.max_length}

    # -- entry points ---------------------------------------------------------------------------
    def build(
        self,
        source: TraceSource | Iterable[ExecutionTrace],
        out: str | Path,
        *,
        parquet: bool = False,
        overwrite: bool = False,
        on_progress: Progress | None = None,
    ) -> BuildResult:
        """Build the dataset into `out` (see the module docstring for the layout)."""
        import time

        started = time.perf_counter()
        out = Path(out).expanduser()
        _prepare_out(out, overwrite)
        src = _Source(source, self.filters, self.stats)
        why_not: str | None = "the traces are given in memory"
        if src.store is not None:
            why_not = columnar.reason_not(self.builder, src.store, self)
            src.columnar = self.stats.columnar = why_not is None
            log.debug(
                "flowrl: %s build%s", "columnar" if why_not is None else "row-by-row", f" ({why_not})" * bool(why_not)
            )
        shuffle = {TRAIN} if self.builder.shuffle_train else set()
        sink = DiskSink(out / ".flowrl-build", self.builder.features(), shuffle, self.seed)
        pool = self._pool_now = self._pool(src, why_not, out)
        src.columns = ["conv_chars"] if pool else ["conv_chars", *HEAVY]
        try:
            with src.operation() as seen:  # every pass of this build shares one record of problems
                self._run(src, sink, on_progress)
            problems = list(seen or [])
            counts = self._check_counts(sink.counts(), src)
            if pool is None:
                arrows = sink.finish(out, on_progress=on_progress)
            else:
                arrows = self._finish(pool, sink, out, on_progress)
            _save(out, arrows, self.builder.features(), parquet)
        finally:
            if pool is not None:
                pool.terminate(wait=False)
            sink.close()
            shutil.rmtree(out / ".flowrl-build", ignore_errors=True)
        metadata = self._metadata(counts, src, parquet)
        (out / METADATA_FILE).write_bytes(orjson.dumps(metadata, option=orjson.OPT_INDENT_2))
        (out / "README.md").write_text(render_card(metadata), encoding="utf-8")
        return BuildResult(out, self.method, counts, self.stats, metadata, time.perf_counter() - started, problems)

    def _pool(self, src: _Source, why_not: str | None, out: Path) -> Workers | None:
        """The worker processes of this build, or None (said once when `workers` asked for them in vain)."""
        if self.workers == 1:
            return None
        if not src.columnar:
            why = why_not or f"a {self.method} build is made in one process"
        elif src.store is None or not src.store.shared:
            why = "the store is in this process's memory"
        else:
            url = cast(Any, src.store).url  # a columnar scan is a SegmentStore's (`columnar.items`)
            return Workers(self.workers, url, self.builder.features().arrow_schema, out / ".flowrl-build")
        log.warning("flowrl: --workers %d: this build runs in one process (%s)", self.workers, why)
        return None

    def _finish(self, pool: Workers, sink: DiskSink, out: Path, on_progress: Progress | None) -> dict[str, list[Path]]:
        sink.parts = pool.spooled()
        parts, arrows = sink.plan(out, self.workers)
        total, done = sum(sink.counts().values()), 0

        def tell(rows: int) -> None:
            nonlocal done
            done += rows
            if on_progress:
                on_progress("write", done, total)

        pool.finish(parts, tell)
        self.worker_peaks = pool.peaks
        return arrows

    def to_dataset_dict(self, source: TraceSource | Iterable[ExecutionTrace]) -> Any:
        """The dataset as an in-memory `datasets.DatasetDict` (no files written)."""
        src = _Source(source, self.filters, self.stats)
        sink = MemorySink()
        self._run(src, sink, None)
        self._check_counts(sink.counts(), src)
        shuffle = {TRAIN} if self.builder.shuffle_train else set()
        return sink.dataset_dict(self.builder.features(), shuffle, self.seed)

    def metadata(self, counts: dict[str, int]) -> dict[str, Any]:
        return self._metadata(counts, None, False)

    # -- the passes -----------------------------------------------------------------------------
    def _run(self, src: _Source, sink: DiskSink | MemorySink, on_progress: Progress | None) -> None:
        total = src.total() if on_progress else None
        if self.grouper.needs_fit and not self.builder.grouped:
            self.grouper.fit(self.grouper.raw_key(t) for ref, t in src.scan() if ref is not None)
        infos: list[TraceInfo] = []
        seen = SeenKeys()
        run = Pending()  # traces of one segment whose rows are made together (`src.columnar`)
        done = told = 0
        for item in src.scan():
            if isinstance(item, columnar.Decided):  # rows decided from their columns (a columnar builder's)
                if run.batch is not item.batch:
                    run = self._add_run(sink, run, item.batch)
                self.builder.column_rows(
                    run, item.rows, item.facts, self._decide(item.facts, seen), self._task, self.stats
                )
                done += len(item)
            else:
                ref, trace = item
                done += 1
                if ref is not None:
                    conv = trace_conversation(trace, self.builder.arguments_as)
                    (kept,) = self._decide([decision_row(trace, conv)], seen)
                    if kept is not None:
                        run = self._trace(sink, run, infos, ref, trace, conv, kept.raw_key)
            if on_progress and (done - told >= 500 or done == total):
                on_progress("read", done, total)
                told = done
        self._add_run(sink, run, None)
        if on_progress:
            on_progress("read", total or 0, total)
        if self.builder.grouped:
            self._grouped(src, sink, infos)

    def _trace(
        self,
        sink: DiskSink | MemorySink,
        run: Pending,
        infos: list[TraceInfo],
        ref: Any,
        trace: ExecutionTrace,
        conv: Conversation,
        raw_key: str,
    ) -> Pending:
        """A trace's rows (or its `TraceInfo`); the run of a segment's pending traces it leaves."""
        if self.builder.grouped:
            info = self.builder.info(trace, ref, raw_key)
            if info is not None:
                infos.append(info)
            return run
        group_id, split = self._task(raw_key)
        if run.batch is not None:  # a segment's pending rows come first
            run = self._add_run(sink, run, None)
        used = False
        for row in self.builder.trace_rows(trace, conv, RowContext(group_id, self.stats)):
            self._add(sink, split, row)
            used = True
        self.stats.traces_used += used
        return run

    def _decide(self, rows: list[DecisionRow], seen: SeenKeys) -> list[Kept | None]:
        """The one decision of a build, for each trace of `rows` in order (a trace read whole, or a stretch of a
        segment's rows read from their columns): `Kept` (its raw task key and label), or None when it is skipped
        (counted: no user turn, no assistant turn, duplicate); a kept trace's reward, label and chat counted."""
        stats, skip, raw_key = self.stats, self.stats.skip, self.grouper.raw_key_of
        duplicate = [False] * len(rows)
        if self.filters.dedupe:  # the keys of the rows that reach the dedupe step, at once
            reach = [i for i, row in enumerate(rows) if row.prompt_end and row.steps]
            keys = [rows[i].key for i in reach]
            new = [seen.add(key) for key in keys] if len(keys) == 1 else seen.first(keys).tolist()
            for i, fresh in zip(reach, new, strict=True):
                duplicate[i] = not fresh
        out: list[Kept | None] = []
        for row, dup in zip(rows, duplicate, strict=True):
            stats.traces_read += 1
            out.append(None)
            if row.prompt_end == 0:
                skip("no user turn")
            elif not row.steps:
                skip("no assistant turn")
            elif dup:
                skip("duplicate")
            else:
                stats.add_reward(row.reward_score)
                label = row.label_at()
                stats.trace_labels[str(label[0]).lower()] += 1
                stats.synthesized += row.synthesized
                stats.without_tool_calls += not row.tool_calls
                out[-1] = Kept(raw_key(row.group_key, row.query_key), label)
        return out

    def _task(self, raw_key: str) -> tuple[str, str]:
        """The group id and split of a task key; remembered, as a store holds many runs of a task (up to
        TASK_CACHE keys: then forgotten all at once)."""
        hit = self._tasks.get(raw_key)
        if hit is None:
            if len(self._tasks) >= TASK_CACHE:
                self._tasks.clear()
            group_id = self.grouper.group_id(raw_key)
            hit = self._tasks[raw_key] = (group_id, split_for(group_id, self.val_fraction, self.seed))
        return hit

    def _grouped(self, src: _Source, sink: DiskSink | MemorySink, infos: list[TraceInfo]) -> None:
        self.grouper.fit(info.group_id for info in infos)
        groups: dict[str, list[TraceInfo]] = defaultdict(list)
        for info in infos:
            info.group_id = self.grouper.group_id(info.group_id)
            groups[info.group_id].append(info)
        self.builder.prepare(infos, self.stats)
        self.stats.groups["total"] = len(groups)
        used: set[str] = set()
        arguments_as = self.builder.arguments_as

        def load(info: TraceInfo) -> tuple[ExecutionTrace, Conversation]:
            trace = src.load(info.ref)
            return trace, trace_conversation(trace, arguments_as)

        for group_id in sorted(groups):
            split = split_for(group_id, self.val_fraction, self.seed)
            for row in self.builder.group_rows(groups[group_id], load, self.stats):
                self._add(sink, split, row)
                used.update(row_trace_ids(row))
        self.stats.traces_used = len(used)

    def _add_run(self, sink: DiskSink | MemorySink, run: Pending, batch: Any) -> Pending:
        """The rows of `run` (traces of one segment) made with Arrow, added as `_add` adds rows one by one: here,
        or by a worker process. Returns a new run for the traces of `batch`."""
        if not run:
            return Pending(batch)
        assert isinstance(sink, DiskSink)
        made = self.builder.column_plan(run)
        self.stats.dropped_too_long += made.dropped
        self.stats.traces_used += made.used
        if not len(made.parent):
            return Pending(batch)
        if self._pool_now is not None:
            names, keys, seq = sink.assign(made.split)
            self._pool_now.submit(SegmentTask(run.batch.path, run.batch.location, made, names, keys, seq))
        else:
            sink.add_batch(made.split, self.builder.column_table(run.batch.table, made, sink.features.arrow_schema))
        for split in dict.fromkeys(made.split.tolist()):  # in the order the rows come
            labels = made.label[made.split == split]
            self.stats.rows[split] += len(labels)
            for label in (bool(labels[0]), not labels[0]):
                n = int((labels == label).sum())
                if n:
                    self.stats.labels.setdefault(split, Counter())["true" if label else "false"] += n
        return Pending(batch)

    def _add(self, sink: DiskSink | MemorySink, split: str, row: dict[str, Any]) -> None:
        if self.budget is not None:
            fits, tokens = self.budget.fits(row)
            if not fits:
                self.stats.dropped_too_long += 1
                self.stats.dropped_rows.append(
                    {
                        "split": split,
                        "trace_ids": row_trace_ids(row),
                        "tokens": tokens,
                        "reason": f"longer than {self.budget.max_length} tokens",
                    }
                )
                return
        sink.add(split, row)
        self.stats.rows[split] += 1
        if "label" in row:
            self.stats.add_label(split, row["label"])

    def _check_counts(self, counts: dict[str, int], src: _Source) -> dict[str, int]:
        where = src.describe()
        filters = self.filters.describe()
        filters.pop("dedupe", None)
        shown = ", ".join(f"{k}={v}" for k, v in filters.items()) or "none"
        if self.stats.traces_read == 0:
            hint = " (unreadable files were skipped: see the warnings)" if self.stats.unreadable else ""
            raise DatasetError(
                f"no traces under {where} match the filters ({shown}){hint}: "
                "check --store and the filters, or capture/ingest traces first (`flowrl ingest PATH`)"
            )
        if not counts:
            reasons = "; ".join(
                f"{n} {k}"
                for k, n in {
                    **self.stats.skipped,
                    **{k: v for k, v in self.stats.groups.items() if k not in ("used", "total")},
                }.items()
            )
            too_long = (
                f"; {self.stats.dropped_too_long} rows over the length budget" if self.stats.dropped_too_long else ""
            )
            raise DatasetError(
                f"no {self.method} rows from {self.stats.traces_read} traces under {where} "
                f"(filters: {shown}): {reasons or 'nothing usable'}{too_long}"
            )
        if TRAIN not in counts and VALIDATION in counts:
            raise DatasetError(
                f"every task fell into the validation split ({counts[VALIDATION]} rows): "
                "lower --val-fraction (or use 0) or add traces of more tasks"
            )
        return {k: counts[k] for k in SPLITS if k in counts}

    def _metadata(self, counts: dict[str, int], src: _Source | None, parquet: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "method": self.method,
            "format": getattr(self.builder, "card_format", None),
            "flowrl_version": __version__,
            "created": datetime.now().isoformat(timespec="seconds"),
            "store": src.describe() if src is not None else None,
            "counts": counts,
            "desirable_weight": None,
            "undesirable_weight": None,
            "splits": {
                "names": list(counts),
                "val_fraction": self.val_fraction,
                "seed": self.seed,
                "rule": "by group: blake2b(seed:group_id) / 2**64 < val_fraction -> validation",
            },
            "filters": self.filters.describe(),
            "grouping": self.grouper.describe(),
            "options": self.builder.options(),
            "files": {
                "dataset_dict": "dataset_dict.json",
                "jsonl": [f"data/{k}.jsonl" for k in counts],
                "parquet": [f"data/{k}.parquet" for k in counts] if parquet else [],
            },
            "stats": self.stats.to_dict(),
        }
        meta.update(self.builder.weights(self.stats))
        return meta


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: give a folder")
    if out.is_dir() and any(out.iterdir()):
        ours = [out / name for name in OUTPUT_NAMES if (out / name).exists()]
        others = [p for p in out.iterdir() if p.name not in OUTPUT_NAMES]
        if not overwrite or others:
            what = "holds other files" if others else "already holds a dataset"
            raise ConfigError(f"--out {out} {what}: pick an empty folder" + ("" if others else " or pass --overwrite"))
        for path in ours:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _save(out: Path, arrows: dict[str, list[Path]], features: Any, parquet: bool) -> None:
    """Put each split's Arrow files where `datasets.load_from_disk` finds them, with the state and info files that
    `Dataset.save_to_disk` writes. Neither its own copy nor opening the files is needed: a copy would read every
    row again, and opening memory-maps them, which for a large build takes hundreds of MiB of resident pages."""
    import json
    import os
    from dataclasses import asdict

    from datasets import Dataset, DatasetInfo, config
    from datasets.fingerprint import Hasher

    info = asdict(DatasetInfo(features=features))
    for split, paths in arrows.items():
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        names = [f"data-{i:05d}-of-{len(paths):05d}.arrow" for i in range(len(paths))]
        stats = []  # what identifies these files, as datasets' own fingerprint does
        for path, name in zip(paths, names, strict=True):
            os.replace(path, folder / name)
            st = os.stat(folder / name)
            stats.append((name, st.st_size, st.st_mtime_ns))
        state = {
            "_data_files": [{"filename": name} for name in names],
            "_fingerprint": Hasher.hash([str(folder), stats]),
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": None,
        }
        (folder / config.DATASET_STATE_JSON_FILENAME).write_text(json.dumps(state, indent=2, sort_keys=True))
        (folder / config.DATASET_INFO_FILENAME).write_text(json.dumps({k: info[k] for k in sorted(info)}, indent=2))
        if parquet:
            from datasets import concatenate_datasets

            shards = [Dataset.from_file(str(folder / name)) for name in names]
            ds = shards[0] if len(shards) == 1 else concatenate_datasets(shards)
            ds.to_parquet(str(out / "data" / f"{split}.parquet"))
            del ds, shards
    (out / config.DATASETDICT_JSON_FILENAME).write_text(json.dumps({"splits": list(arrows)}))
