"""Where built rows go: a list per split in memory, or spool files on disk turned into the outputs.

The disk sink appends each row as one JSON line to a spool file (remembering where each line starts, 8 bytes
a row) and, a batch at a time, as Arrow to a second spool in the features' types, so a build holds no rows in
memory and nothing is parsed twice. Rows of a split that must be shuffled are spooled into 32 buckets drawn at
random (`Shuffle`); `finish` reads one bucket at a time, permutes it, and appends it to the final JSONL and to
the Arrow file behind the `datasets.Dataset`: memory is bounded by a bucket, not by the split.

A row's value may be `RawJSON` (JSON text already serialised: a columnar build's messages) or `RawJSONList` (a
list of them), written as they are.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

WRITE_BATCH = 1000
SPOOL_BATCH = 1024  # rows per Arrow batch of a bucket's spool
BUCKETS = 32  # a finish holds one bucket (1/32 of a split) in memory at a time
SHUFFLE_BLOCK = 65536


class RawJSON:
    """JSON text put into a row as it is (`text` must be valid JSON; `"null"` is a null). Not a dataclass:
    orjson would write those as objects."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"RawJSON({self.text!r})"


class RawJSONList:
    """A list of JSON texts (`RawJSON`'s) put into a row as a JSON array, as it is."""

    __slots__ = ("texts",)

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def __repr__(self) -> str:
        return f"RawJSONList({self.texts!r})"


def _default(value: Any) -> Any:
    if type(value) is RawJSON:
        return orjson.Fragment(value.text)
    if type(value) is RawJSONList:
        return orjson.Fragment("[" + ",".join(value.texts) + "]")
    return str(value)


def _dumps(row: dict[str, Any]) -> bytes:
    return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS, default=_default)


class Shuffle:
    """The seeded order rows are written in, bounded in memory (an external shuffle): as each row comes it is
    drawn into one of `BUCKETS` buckets (numpy's PCG64 from `seed`); at the end each bucket is permuted (from
    `seed` and the bucket) and the buckets follow one another. Without `shuffle`, one bucket in order."""

    def __init__(self, seed: int, shuffle: bool) -> None:
        import numpy as np

        self.seed, self.shuffle = seed, shuffle
        self._rng = np.random.default_rng(seed)
        self._ids: list[int] = []
        self._pos = 0

    def bucket(self) -> int:
        if not self.shuffle:
            return 0
        if self._pos == len(self._ids):
            self._ids, self._pos = self._rng.integers(0, BUCKETS, SHUFFLE_BLOCK).tolist(), 0
        self._pos += 1
        return self._ids[self._pos - 1]

    def take(self, n: int) -> Any:
        """The buckets of the next `n` rows (numpy), as `n` calls of `bucket` give them."""
        import numpy as np

        if not self.shuffle:
            return np.zeros(n, dtype=np.int64)
        parts = []
        while n:
            if self._pos == len(self._ids):
                self._ids, self._pos = self._rng.integers(0, BUCKETS, SHUFFLE_BLOCK).tolist(), 0
            got = self._ids[self._pos : self._pos + n]
            self._pos += len(got)
            n -= len(got)
            parts.append(got)
        return np.array([b for part in parts for b in part], dtype=np.int64)

    def permutation(self, bucket: int, n: int) -> Any:
        import numpy as np

        return np.random.default_rng([self.seed, bucket + 1]).permutation(n) if self.shuffle else np.arange(n)


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
    """Rows spooled per split and bucket (`Shuffle`) to `{tmp}/{split}-{bucket}.spool` (JSON lines) and `.ipc`
    (Arrow); `finish` writes the JSONL and the Arrow dataset files, a bucket in memory at a time."""

    def __init__(self, tmp: Path, features: Any, shuffle: set[str], seed: int) -> None:
        self.tmp = tmp
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.features, self.shuffle, self.seed = features, shuffle, seed
        self._splits: dict[str, tuple[Shuffle, dict[int, _Spool]]] = {}

    def add(self, split: str, row: dict[str, Any]) -> None:
        entry = self._splits.get(split)
        if entry is None:
            entry = self._splits[split] = (Shuffle(self.seed, split in self.shuffle), {})
        order, spools = entry
        bucket = order.bucket()
        spool = spools.get(bucket)
        if spool is None:
            spool = spools[bucket] = _Spool(self.tmp / f"{split}-{bucket:02d}", self.features)
        spool.add(row)

    def add_batch(self, splits: Any, table: Any, lines: Any) -> None:
        """Rows made with Arrow (`flowrl.data.columnar_kto`): `table` in the features' schema, each row's JSON line
        (a string array, newlines included) and split (a numpy array), spooled as `add` would spool them one by
        one. One `take` puts the rows in (split, bucket) order; each spool gets a slice."""
        import numpy as np

        names = list(dict.fromkeys(splits.tolist()))  # in the order the rows come
        spool_of = np.empty(len(splits), dtype=np.int64)
        for rank, split in enumerate(names):
            entry = self._splits.get(split)
            if entry is None:
                entry = self._splits[split] = (Shuffle(self.seed, split in self.shuffle), {})
            mask = splits == split
            spool_of[mask] = rank * BUCKETS + entry[0].take(int(mask.sum()))
        perm = np.argsort(spool_of, kind="stable")
        table, lines, spool_of = table.take(perm), lines.take(perm), spool_of[perm]
        cuts = np.flatnonzero(np.diff(spool_of)) + 1
        for begin, end in zip([0, *cuts.tolist()], [*cuts.tolist(), len(perm)], strict=True):
            split, bucket = names[spool_of[begin] // BUCKETS], int(spool_of[begin] % BUCKETS)
            spools = self._splits[split][1]
            spool = spools.get(bucket)
            if spool is None:
                spool = spools[bucket] = _Spool(self.tmp / f"{split}-{bucket:02d}", self.features)
            spool.add_batch(table.slice(begin, end - begin), lines.slice(begin, end - begin))

    def counts(self) -> dict[str, int]:
        return {k: sum(len(s.offsets) for s in spools.values()) for k, (_o, spools) in self._splits.items()}

    def finish(
        self, out: Path, *, on_progress: Callable[[str, int, int | None], None] | None = None
    ) -> dict[str, Path]:
        """Write `out/data/{split}.jsonl` and the Arrow datasets (returned by split)."""
        import pyarrow as pa
        from datasets.arrow_writer import ArrowWriter

        data = out / "data"
        data.mkdir(parents=True, exist_ok=True)
        arrows: dict[str, Path] = {}
        total = sum(self.counts().values())
        done = 0
        for split, (order, spools) in self._splits.items():
            arrows[split] = self.tmp / f"{split}.arrow"
            with (
                open(data / f"{split}.jsonl", "wb") as jsonl,
                ArrowWriter(features=self.features, path=str(arrows[split]), writer_batch_size=WRITE_BATCH) as writer,
            ):
                for bucket in sorted(spools):
                    spool = spools[bucket]
                    spool.close()
                    perm = pa.array(order.permutation(bucket, len(spool.offsets)))
                    jsonl.write(spool.lines(perm))
                    with pa.OSFile(str(spool.ipc_path)) as ipc:
                        table = pa.ipc.open_file(ipc).read_all()
                    writer.write_table(table.take(perm))
                    del table
                    spool.remove()
                    done += len(perm)
                    if on_progress:
                        on_progress("write", done, total)
                writer.finalize()
        return arrows

    def close(self) -> None:
        for _order, spools in self._splits.values():
            for spool in spools.values():
                spool.close()


class _Spool:
    """One bucket's spools: JSON lines (with where each starts) and Arrow batches."""

    def __init__(self, stem: Path, features: Any) -> None:
        import pyarrow as pa

        self.features = features
        self.schema = features.arrow_schema
        self.lines_path, self.ipc_path = stem.with_suffix(".spool"), stem.with_suffix(".ipc")
        self._lines: IO[bytes] = open(self.lines_path, "wb")  # noqa: SIM115 - closed in close()
        self._ipc = pa.ipc.new_file(str(self.ipc_path), self.schema)
        self._columns: dict[str, list[Any]] = {name: [] for name in features}
        self._convert = [(self._columns[name].append, _converter(feature)) for name, feature in features.items()]
        self._first = self._columns[next(iter(features))]
        self.offsets = array("q")
        self.pos = 0
        self._tables: list[Any] = []  # batches from `add_batch`, written when SPOOL_BATCH rows are waiting
        self._table_rows = 0
        self._closed = False

    def add(self, row: dict[str, Any]) -> None:
        if self._tables:
            self._write_tables()
        line = _dumps(row)
        self.offsets.append(self.pos)
        self.pos += len(line)
        self._lines.write(line)
        for (append, convert), name in zip(self._convert, self._columns, strict=True):
            append(convert(row.get(name)))
        if len(self._first) >= SPOOL_BATCH:
            self._spill()

    def add_batch(self, table: Any, lines: Any) -> None:
        import numpy as np

        if self._first:
            self._spill()
        where = _offsets(lines, np.int32)  # of the rows' text in the data buffer
        self.offsets.extend((where[:-1] - where[0] + self.pos).tolist())
        self._lines.write(memoryview(lines.buffers()[2])[where[0] : where[-1]])
        self.pos += int(where[-1] - where[0])
        self._tables.append(table)
        self._table_rows += table.num_rows
        if self._table_rows >= SPOOL_BATCH:
            self._write_tables()

    def _write_tables(self) -> None:
        import pyarrow as pa

        self._ipc.write_table(pa.concat_tables(self._tables).combine_chunks())
        self._tables, self._table_rows = [], 0

    def lines(self, perm: Any) -> bytes:
        """The spooled JSON lines in the order `perm` (an Arrow array of positions) gives."""
        import numpy as np
        import pyarrow as pa

        data = pa.py_buffer(self.lines_path.read_bytes())
        starts = array("q", self.offsets)
        starts.append(self.pos)
        spooled = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), len(self.offsets), [None, pa.py_buffer(starts), data]
        )
        taken = spooled.take(perm)
        if not len(taken):
            return b""
        where = _offsets(taken, np.int64)
        return memoryview(taken.buffers()[2])[where[0] : where[-1]].tobytes()

    def _spill(self) -> None:
        import pyarrow as pa

        arrays = [_arrow(self._columns[name], feature) for name, feature in self.features.items()]
        self._ipc.write_batch(pa.record_batch(arrays, schema=self.schema))
        for values in self._columns.values():
            values.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._first:
            self._spill()
        if self._tables:
            self._write_tables()
        self._ipc.close()
        self._lines.close()

    def remove(self) -> None:
        self.lines_path.unlink(missing_ok=True)
        self.ipc_path.unlink(missing_ok=True)


def _offsets(array: Any, dtype: Any) -> Any:
    """Where each value of a (large) string or binary Arrow array starts in its data buffer, and where the last
    ends (numpy int64)."""
    import numpy as np

    offsets = np.frombuffer(array.buffers()[1], dtype=dtype)
    return offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)


def _converter(feature: Any) -> Callable[[Any], Any]:
    """A function giving a row's value with every Json leaf of `feature` as JSON text (None for null), ready for
    `_arrow`."""
    from datasets import Json, List

    if isinstance(feature, Json):
        return _json_text
    if isinstance(feature, List):
        inner = _converter(feature.feature)
        if inner is _same:
            return _same
        if inner is _json_text:
            return _json_texts
        return lambda value: None if value is None else [inner(v) for v in value]
    return _same


def _same(value: Any) -> Any:
    return value


def _json_texts(value: Any) -> list[Any] | None:
    if value is None:
        return None
    if type(value) is RawJSONList:
        return value.texts
    return [_json_text(v) for v in value]


def _json_text(value: Any) -> str | None:
    if value is None:
        return None
    if type(value) is RawJSON:
        return None if value.text == "null" else value.text
    return orjson.dumps(value, default=_default).decode()


def _arrow(values: list[Any], feature: Any) -> Any:
    """Arrow array of `values` (Json leaves already text) for the feature types the builders use: Value, Json
    and List of those."""
    import pyarrow as pa
    from datasets import Json, List

    if isinstance(feature, Json):
        return pa.array(values, type=pa.json_())
    if isinstance(feature, List):
        offsets: list[int] = [0]
        flat: list[Any] = []
        mask: list[bool] = []
        for v in values:
            mask.append(v is None)
            flat.extend(v or ())
            offsets.append(len(flat))
        child = _arrow(flat, feature.feature)
        return pa.ListArray.from_arrays(
            pa.array(offsets, pa.int32()), child, mask=pa.array(mask) if any(mask) else None
        )
    return pa.array(values, type=feature.pa_type)
