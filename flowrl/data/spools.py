"""Spool files of a dataset build: the rows of one split and shuffle bucket, as written by one process, and the
step that turns a bucket's spools into the split's final JSONL and Arrow files.

A spool is three files beside each other: `{stem}.spool` (the rows' JSON lines), `{stem}.ipc` (the rows as Arrow
batches in the features' schema) and, once closed, `{stem}.idx` (where each line starts, and each row's sequence
number: its place among the split's rows as they were made). Several processes may spool rows of one bucket
(`flowrl.data.workers`); `finish_part` puts a bucket's rows back in their sequence order, permutes them with the
bucket's seeded permutation (`permutation`), and writes them: the same bytes whichever process spooled which row.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

SPOOL_BATCH = 1024  # rows per Arrow batch of a spool
WRITE_BATCH = 1000  # rows per batch of a final Arrow file (`datasets`' default)
BUCKETS = 32  # a finish holds one bucket (1/32 of a split) in memory at a time
ORDERED_BUCKET = 65536  # rows of a bucket of a split written in order (not shuffled)
SPAN = 1 << 32  # a row's spool key: its split's index * SPAN + its bucket
FINISH_CHUNK = 8 * WRITE_BATCH  # rows a finish takes at a time from a bucket


def _dumps(row: dict[str, Any]) -> bytes:
    return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS, default=str)


def permutation(seed: int, shuffle: bool, bucket: int, n: int) -> Any:
    """The order of a bucket's `n` rows in the final files (numpy): seeded from `seed` and the bucket."""
    import numpy as np

    return np.random.default_rng([seed, bucket + 1]).permutation(n) if shuffle else np.arange(n)


class Spool:
    """One bucket's rows from one process: JSON lines, Arrow batches and (on `close`) the index."""

    def __init__(self, stem: Path, schema: Any, features: Any = None) -> None:
        """`features` (`datasets.Features`) only for rows added one by one (`add`)."""
        import pyarrow as pa

        self.stem, self.features, self.schema = stem, features, schema
        self._lines: IO[bytes] = open(stem.with_suffix(".spool"), "wb")  # noqa: SIM115 - closed in close()
        self._ipc = pa.ipc.new_file(str(stem.with_suffix(".ipc")), schema)
        self._columns: dict[str, list[Any]] = {}
        if features is not None:
            self._columns = {name: [] for name in features}
            self._convert = [(self._columns[name].append, _converter(f)) for name, f in features.items()]
        self.offsets = array("q")
        self.seq = array("q")
        self.pos = 0
        self._pending = 0  # rows added one by one, not yet written as a batch
        self._closed = False

    def add(self, row: dict[str, Any], seq: int) -> None:
        line = _dumps(row)
        self.offsets.append(self.pos)
        self.seq.append(seq)
        self.pos += len(line)
        self._lines.write(line)
        for (append, convert), name in zip(self._convert, self._columns, strict=True):
            append(convert(row.get(name)))
        self._pending += 1
        if self._pending >= SPOOL_BATCH:
            self._spill()

    def add_batch(self, table: Any, lines: Any, seq: Any) -> None:
        """Rows made with Arrow: `table` in the schema, their JSON lines (a string array, newlines included) and
        their sequence numbers (numpy)."""
        import numpy as np

        if self._pending:
            self._spill()
        where = _offsets(lines, np.int32)  # of the rows' text in the data buffer
        self.offsets.extend((where[:-1] - where[0] + self.pos).tolist())
        self.seq.extend(seq.tolist())
        self._lines.write(memoryview(lines.buffers()[2])[where[0] : where[-1]])
        self.pos += int(where[-1] - where[0])
        self._ipc.write_table(table)  # at once: a slice kept for later would keep its whole segment's rows

    def _spill(self) -> None:
        import pyarrow as pa

        arrays = [_arrow(self._columns[name], feature) for name, feature in self.features.items()]
        self._ipc.write_batch(pa.record_batch(arrays, schema=self.schema))
        for values in self._columns.values():
            values.clear()
        self._pending = 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pending:
            self._spill()
        self._ipc.close()
        self._lines.close()
        self.offsets.append(self.pos)
        with open(self.stem.with_suffix(".idx"), "wb") as idx:
            idx.write(len(self.seq).to_bytes(8, "little") + self.offsets.tobytes() + self.seq.tobytes())
        self.offsets, self.seq = array("q"), array("q")  # in the file now: a finish reads them from there


class SpoolSet:
    """The spools one process writes, a `Spool` per (split, bucket), under `folder`."""

    def __init__(self, folder: Path, schema: Any, features: Any = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.schema, self.features = folder, schema, features
        self.spools: dict[tuple[str, int], Spool] = {}

    def spool(self, split: str, bucket: int) -> Spool:
        spool = self.spools.get((split, bucket))
        if spool is None:
            stem = self.folder / f"{split}-{bucket:02d}"
            spool = self.spools[split, bucket] = Spool(stem, self.schema, self.features)
        return spool

    def add_batch(self, names: list[str], keys: Any, seq: Any, table: Any, lines: Any) -> None:
        """Rows made with Arrow, each with its key (`names` index * SPAN + bucket) and sequence number: one
        `take` puts them in key order, each spool gets a slice."""
        import numpy as np

        perm = np.argsort(keys, kind="stable")
        table, lines, keys, seq = table.take(perm), lines.take(perm), keys[perm], seq[perm]
        cuts = np.flatnonzero(np.diff(keys)) + 1
        for begin, end in zip([0, *cuts.tolist()], [*cuts.tolist(), len(perm)], strict=True):
            spool = self.spool(names[keys[begin] // SPAN], int(keys[begin] % SPAN))
            spool.add_batch(table.slice(begin, end - begin), lines.slice(begin, end - begin), seq[begin:end])

    def close(self) -> dict[tuple[str, int], str]:
        """Close every spool; their stems by (split, bucket)."""
        for spool in self.spools.values():
            spool.close()
        return {key: str(spool.stem) for key, spool in self.spools.items()}


@dataclass
class FinishPart:
    """Buckets of one split, in order, to write as one Arrow file and a byte range of the split's JSONL."""

    split: str
    buckets: list[tuple[int, list[str]]]  # (bucket, stems of its spools)
    jsonl: str
    offset: int  # where in `jsonl` the first bucket's lines go
    arrow: str
    seed: int
    shuffle: bool


def finish_part(part: FinishPart, schema: Any) -> int:
    """Write `part` (see `FinishPart`); each spool is removed once written. Returns the rows written."""
    import numpy as np
    import pyarrow as pa

    done = 0
    with open(part.jsonl, "r+b") as jsonl, pa.ipc.new_stream(part.arrow, schema) as writer:
        jsonl.seek(part.offset)
        for bucket, stems in part.buckets:
            seqs, starts, tables = [], [], []
            data = bytearray(sum(Path(stem).with_suffix(".spool").stat().st_size for stem in stems))
            size = 0
            for stem in stems:  # the lines of every spool of the bucket, read into one buffer
                offsets, seq = _index(Path(stem))
                seqs.append(seq)
                starts.append(offsets[:-1] + size)
                with open(Path(stem).with_suffix(".spool"), "rb") as fh:
                    size += fh.readinto(memoryview(data)[size:])
            seq = np.concatenate(seqs)
            order = np.argsort(seq, kind="stable")[permutation(part.seed, part.shuffle, bucket, len(seq))]
            starts.append(np.array([size], dtype=np.int64))
            spooled = pa.LargeBinaryArray.from_buffers(
                pa.large_binary(), len(seq), [None, pa.py_buffer(np.concatenate(starts)), pa.py_buffer(data)]
            )
            chunks = [pa.array(order[i : i + FINISH_CHUNK]) for i in range(0, len(order), FINISH_CHUNK)]
            for chunk in chunks:  # taken a chunk at a time: memory is the bucket once, not twice
                taken = spooled.take(chunk)
                where = _offsets(taken, np.int64)
                jsonl.write(memoryview(taken.buffers()[2])[where[0] : where[-1]])
            del spooled, data, taken
            for stem in stems:
                with pa.memory_map(str(Path(stem).with_suffix(".ipc"))) as ipc:
                    tables.append(pa.ipc.open_file(ipc).read_all())
            table = pa.concat_tables(tables).combine_chunks()
            del tables
            for chunk in chunks:
                writer.write_table(table.take(chunk), max_chunksize=WRITE_BATCH)
            done += table.num_rows
            del table
            for stem in stems:
                for suffix in (".spool", ".ipc", ".idx"):
                    Path(stem).with_suffix(suffix).unlink(missing_ok=True)
    return done


def _index(stem: Path) -> tuple[Any, Any]:
    """A closed spool's line offsets (one more than rows: the end) and sequence numbers."""
    import numpy as np

    data = stem.with_suffix(".idx").read_bytes()
    n = int.from_bytes(data[:8], "little")
    values = np.frombuffer(data, dtype=np.int64, offset=8)
    return values[: n + 1], values[n + 1 :]


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
    return None if value is None else [_json_text(v) for v in value]


def _json_text(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value, default=str).decode()


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
