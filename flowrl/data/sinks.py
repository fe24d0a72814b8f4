"""Where built rows go: a list per split in memory, or spool files on disk turned into the outputs.

The disk sink spools each row as Arrow in the features' types, a batch at a time, and a row added one by one also
as its JSON line (`flowrl.data.spools`; a row made with Arrow gets its line when it is written), so a build holds
no rows in memory and nothing is parsed twice. Rows
of a split that must be shuffled are spooled into 64 buckets drawn at random (`Shuffle`); `finish` reads one
bucket at a time, permutes it, and appends it to the final JSONL and to the Arrow file behind the
`datasets.Dataset`: memory is bounded by a bucket, not by the split. A columnar build may make rows in other
processes (`flowrl.data.workers`): the sink draws their buckets and sequence numbers, they spool the rows, and
the finish is shared out by buckets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowrl.data.spools import (
    BUCKETS,
    ORDERED_BUCKET,
    SPAN,
    FinishPart,
    SpoolSet,
    finish_part,
    lines_size,
    permutation,
)

__all__ = ["BUCKETS", "DiskSink", "MemorySink", "Shuffle", "ordered"]

SHUFFLE_BLOCK = 65536


class Shuffle:
    """The seeded order rows are written in, bounded in memory (an external shuffle): as each row comes it is
    drawn into one of `BUCKETS` buckets (numpy's PCG64 from `seed`); at the end each bucket is permuted (from
    `seed` and the bucket) and the buckets follow one another. Without `shuffle`, rows keep their order, in
    buckets of `ORDERED_BUCKET` rows (a finish holds one bucket, not the split)."""

    def __init__(self, seed: int, shuffle: bool) -> None:
        import numpy as np

        self.seed, self.shuffle = seed, shuffle
        self._rng = np.random.default_rng(seed)
        self._ids: list[int] = []
        self._pos = 0
        self._rows = 0  # rows drawn so far (without `shuffle`)

    def bucket(self) -> int:
        if not self.shuffle:
            self._rows += 1
            return (self._rows - 1) // ORDERED_BUCKET
        if self._pos == len(self._ids):
            self._refill()
        self._pos += 1
        return self._ids[self._pos - 1]

    def _refill(self) -> None:
        self._ids, self._pos = self._rng.integers(0, BUCKETS, SHUFFLE_BLOCK).tolist(), 0

    def take(self, n: int) -> Any:
        """The buckets of the next `n` rows (numpy), as `n` calls of `bucket` give them."""
        import numpy as np

        if not self.shuffle:
            self._rows += n
            return np.arange(self._rows - n, self._rows, dtype=np.int64) // ORDERED_BUCKET
        parts = []
        while n:
            if self._pos == len(self._ids):
                self._refill()
            got = self._ids[self._pos : self._pos + n]
            self._pos += len(got)
            n -= len(got)
            parts.append(got)
        return np.array([b for part in parts for b in part], dtype=np.int64)

    def permutation(self, bucket: int, n: int) -> Any:
        return permutation(self.seed, self.shuffle, bucket, n)


def ordered(n: int, shuffle: bool, seed: int) -> list[int]:
    """The order `Shuffle` writes `n` rows in, as positions in the order they came."""
    order = Shuffle(seed, shuffle)
    buckets: dict[int, list[int]] = {}
    for i in range(n):
        buckets.setdefault(order.bucket(), []).append(i)
    out: list[int] = []
    for b in sorted(buckets):
        rows = buckets[b]
        out += [rows[j] for j in order.permutation(b, len(rows))]
    return out


class MemorySink:
    """Rows kept in lists, for `DatasetPipeline.to_dataset_dict`."""

    def __init__(self) -> None:
        self.rows: dict[str, list[dict[str, Any]]] = {}

    def add(self, split: str, row: dict[str, Any]) -> None:
        self.rows.setdefault(split, []).append(row)

    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.rows.items()}

    def dataset_dict(self, features: Any, shuffle: set[str], seed: int) -> Any:
        from datasets import Dataset, DatasetDict

        out = {}
        for split, rows in self.rows.items():
            rows = [rows[i] for i in ordered(len(rows), split in shuffle, seed)]
            out[split] = Dataset.from_list(rows, features=features)
        return DatasetDict(out)

    def close(self) -> None:
        self.rows.clear()


class DiskSink:
    """Rows spooled per split and bucket (`Shuffle`) under `tmp` (`flowrl.data.spools`); `finish` writes the JSONL
    and the Arrow dataset files, a bucket in memory at a time per process."""

    def __init__(self, tmp: Path, features: Any, shuffle: set[str], seed: int) -> None:
        self.tmp = tmp
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.features, self.shuffle, self.seed = features, shuffle, seed
        self._orders: dict[str, Shuffle] = {}  # by split, in the order rows came
        self._counts: Counter[str] = Counter()
        self._seq = 0
        self.own = SpoolSet(tmp / "spools", features.arrow_schema, features)
        self.parts: list[dict[tuple[str, int], str]] = []  # spools other processes wrote

    def _order(self, split: str) -> Shuffle:
        order = self._orders.get(split)
        if order is None:
            order = self._orders[split] = Shuffle(self.seed, split in self.shuffle)
        return order

    def add(self, split: str, row: dict[str, Any]) -> None:
        self.own.spool(split, self._order(split).bucket()).add(row, self._seq)
        self._seq += 1
        self._counts[split] += 1

    def assign(self, splits: Any) -> tuple[list[str], Any, Any]:
        """For rows to be spooled (their splits, numpy, in the order they come): the split names, each row's key
        (name index * SPAN + bucket) and sequence number, as `add` would draw them one by one."""
        import numpy as np

        names = list(dict.fromkeys(splits.tolist()))
        keys = np.empty(len(splits), dtype=np.int64)
        for rank, split in enumerate(names):
            mask = splits == split
            n = int(mask.sum())
            keys[mask] = rank * SPAN + self._order(split).take(n)
            self._counts[split] += n
        seq = np.arange(self._seq, self._seq + len(splits), dtype=np.int64)
        self._seq += len(splits)
        return names, keys, seq

    def add_batch(self, splits: Any, table: Any) -> None:
        """Rows made with Arrow (`flowrl.data.columnar_kto`): `table` in the features' schema and each row's split
        (numpy), spooled as `add` would spool them one by one."""
        names, keys, seq = self.assign(splits)
        self.own.add_batch(names, keys, seq, table)

    def counts(self) -> dict[str, int]:
        return {k: self._counts[k] for k in self._orders if self._counts[k]}

    def plan(self, out: Path, processes: int = 1) -> tuple[list[FinishPart], dict[str, list[Path]]]:
        """The finish shared out: per split, its buckets cut into up to `processes` runs of about equal size, each
        run an Arrow file and a byte range of `out/data/{split}.jsonl` (created at its full size here)."""
        stems: dict[tuple[str, int], list[str]] = {}
        for spools in [self.own.close(), *self.parts]:
            for key, stem in spools.items():
                stems.setdefault(key, []).append(stem)
        data = out / "data"
        data.mkdir(parents=True, exist_ok=True)
        parts: list[FinishPart] = []
        arrows: dict[str, list[Path]] = {}
        for split in self.counts():
            buckets = sorted((b, stems[s, b]) for s, b in stems if s == split)
            sizes = [sum(lines_size(Path(stem)) for stem in group) for _b, group in buckets]
            jsonl = data / f"{split}.jsonl"
            with open(jsonl, "wb") as fh:
                fh.truncate(sum(sizes))
            share = sum(sizes) / max(1, processes)
            offset, run, run_size = 0, [], 0
            for i, (bucket, size) in enumerate(zip(buckets, sizes, strict=True)):
                run.append(bucket)
                run_size += size
                if run_size >= share * (1 - 1e-9) or i == len(buckets) - 1:
                    arrow = self.tmp / f"{split}-{len(arrows.get(split, [])):05d}.arrow"
                    arrows.setdefault(split, []).append(arrow)
                    parts.append(
                        FinishPart(split, run, str(jsonl), offset, str(arrow), self.seed, split in self.shuffle)
                    )
                    offset, run, run_size = offset + run_size, [], 0
        return parts, arrows

    def finish(
        self, out: Path, *, on_progress: Callable[[str, int, int | None], None] | None = None
    ) -> dict[str, list[Path]]:
        """Write `out/data/{split}.jsonl` and the Arrow datasets (returned by split) in this process."""
        parts, arrows = self.plan(out)
        total, done = sum(self.counts().values()), 0
        for part in parts:
            done += finish_part(part, self.features.arrow_schema)
            if on_progress:
                on_progress("write", done, total)
        return arrows

    def close(self) -> None:
        self.own.close()
