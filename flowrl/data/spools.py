"""Spool files of a dataset build: the rows of one split and shuffle bucket, as written by one process, and the
step that turns a bucket's spools into the split's final JSONL and Arrow files.

A spool is three files beside each other: `{stem}.spool` (the JSON lines of rows added one by one), `{stem}.ipc`
(the rows as Arrow batches in the features' schema) and, once closed, `{stem}.idx` (where each row's line starts,
and each row's sequence number: its place among the split's rows as they were made). A row made with Arrow has an
empty line in the `.spool`: its line is made from its Arrow row when it is written (`flowrl.data.arrow_json`), so
its text is spooled once. Several processes may spool rows of one bucket (`flowrl.data.workers`); `finish_part`
puts a bucket's rows back in their sequence order, permutes them with the bucket's seeded permutation
(`permutation`), and writes them: the same bytes whichever process spooled which row.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from flowrl.data.arrow_json import lines, sizes

SPOOL_BATCH = 1024  # rows per Arrow batch of a spool
WRITE_BATCH = 1000  # rows per batch of a final Arrow file (`datasets`' default)
BUCKETS = 64  # a finish holds one bucket (1/64 of a split) in memory at a time
ORDERED_BUCKET = 32768  # rows of a bucket of a split written in order (not shuffled)
SPAN = 1 << 32  # a row's spool key: its split's index * SPAN + its bucket
WAIT_ROWS = 16384  # rows made with Arrow a process holds before spooling them (`SpoolSet`)
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
        self.made = 0  # bytes of the lines of rows made with Arrow, once made
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

    def add_batch(self, table: Any, seq: Any, made: int) -> None:
        """Rows made with Arrow: `table` in the schema, their sequence numbers (numpy) and the bytes of
        their lines (`arrow_json.sizes`); their lines are empty here."""
        if self._pending:
            self._spill()
        self.offsets.extend([self.pos] * len(seq))
        self.seq.extend(seq.tolist())
        self.made += made
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
            head = len(self.seq).to_bytes(8, "little") + self.made.to_bytes(8, "little")
            idx.write(head + self.offsets.tobytes() + self.seq.tobytes())
        self.offsets, self.seq = array("q"), array("q")  # in the file now: a finish reads them from there


class SpoolSet:
    """The spools one process writes, a `Spool` per (split, bucket), under `folder`. Rows made with Arrow wait
    until `WAIT_ROWS` have come, then go to their spools together: a spool's Arrow batch costs a fixed ~0.1 ms,
    and one segment's rows cut into every bucket were batches of a few dozen rows."""

    def __init__(self, folder: Path, schema: Any, features: Any = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.schema, self.features = folder, schema, features
        self.spools: dict[tuple[str, int], Spool] = {}
        self._splits: list[str] = []  # a waiting row's key: its split's index here * SPAN + its bucket
        self._waiting: list[tuple[Any, Any, Any]] = []  # (keys, seq, table)
        self._waiting_rows = 0

    def spool(self, split: str, bucket: int) -> Spool:
        spool = self.spools.get((split, bucket))
        if spool is None:
            stem = self.folder / f"{split}-{bucket:02d}"
            spool = self.spools[split, bucket] = Spool(stem, self.schema, self.features)
        return spool

    def add_batch(self, names: list[str], keys: Any, seq: Any, table: Any) -> None:
        """Rows made with Arrow, each with its key (`names` index * SPAN + bucket) and sequence number."""
        import numpy as np

        for name in names:
            if name not in self._splits:
                self._splits.append(name)
        rank = np.array([self._splits.index(name) for name in names], dtype=np.int64)
        self._waiting.append((rank[keys // SPAN] * SPAN + keys % SPAN, seq, table))
        self._waiting_rows += len(seq)
        if self._waiting_rows >= WAIT_ROWS:
            self._write_waiting()

    def _write_waiting(self) -> None:
        """The waiting rows to their spools: one `take` puts them in key order, each spool gets a slice."""
        import numpy as np
        import pyarrow as pa

        if not self._waiting:
            return
        keys = np.concatenate([w[0] for w in self._waiting])
        seq = np.concatenate([w[1] for w in self._waiting])
        table = pa.concat_tables([w[2] for w in self._waiting]).combine_chunks()
        self._waiting, self._waiting_rows = [], 0
        perm = np.argsort(keys, kind="stable")
        table, keys, seq = table.take(perm), keys[perm], seq[perm]
        made = np.concatenate([[0], np.cumsum(sizes(table, self.schema))])
        cuts = np.flatnonzero(np.diff(keys)) + 1
        for begin, end in zip([0, *cuts.tolist()], [*cuts.tolist(), len(perm)], strict=True):
            spool = self.spool(self._splits[keys[begin] // SPAN], int(keys[begin] % SPAN))
            spool.add_batch(table.slice(begin, end - begin), seq[begin:end], int(made[end] - made[begin]))

    def close(self) -> dict[tuple[str, int], str]:
        """Close every spool (the waiting rows written first); their stems by (split, bucket)."""
        self._write_waiting()
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
            spooled, table = _read_bucket([Path(stem) for stem in stems])
            order = np.argsort(spooled.seq, kind="stable")[permutation(part.seed, part.shuffle, bucket, len(spooled))]
            written = 0
            for i in range(0, len(order), FINISH_CHUNK):  # a chunk at a time: the bucket is held once, not twice
                chunk = pa.array(order[i : i + FINISH_CHUNK])
                taken = table.take(chunk)
                lines = spooled.lines(taken, chunk, schema)
                where = _offsets(lines)
                written += jsonl.write(memoryview(lines.buffers()[2])[where[0] : where[-1]])
                writer.write_table(taken, max_chunksize=WRITE_BATCH)
            if written != spooled.size:  # the next bucket's lines start where this one's were planned to end
                raise RuntimeError(f"{part.jsonl}: bucket {bucket} made {written} bytes of lines, not {spooled.size}")
            done += len(spooled)
            del spooled, table
            for stem in stems:
                for suffix in (".spool", ".ipc", ".idx"):
                    Path(stem).with_suffix(suffix).unlink(missing_ok=True)
    return done


class _Spooled:
    """A bucket's spooled lines (rows added one by one) and index, its spools one after another."""

    def __init__(self, stems: list[Path]) -> None:
        import numpy as np
        import pyarrow as pa

        seqs, starts, made = [], [], 0
        data = bytearray(sum(stem.with_suffix(".spool").stat().st_size for stem in stems))
        size = 0
        for stem in stems:  # the lines of every spool of the bucket, read into one buffer
            offsets, seq, spool_made = _index(stem)
            seqs.append(seq)
            starts.append(offsets[:-1] + size)
            made += spool_made
            with open(stem.with_suffix(".spool"), "rb") as fh:
                size += fh.readinto(memoryview(data)[size:])
        self.seq = np.concatenate(seqs)
        starts.append(np.array([size], dtype=np.int64))
        offsets = np.concatenate(starts)
        self.made = np.diff(offsets) == 0  # rows made with Arrow: their lines are made from their Arrow rows
        self.size = size + made  # bytes of the bucket's lines
        self.spooled = None
        if size:
            buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
            self.spooled = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(self.seq), buffers)

    def __len__(self) -> int:
        return len(self.seq)

    def lines(self, taken: Any, chunk: Any, schema: Any) -> Any:
        """The lines of the rows `chunk` (`taken`, their Arrow rows): spooled, or made (`arrow_json.lines`)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        made = self.made[chunk.to_numpy()]
        if self.spooled is None or made.all():
            return lines(taken, schema)
        spooled = self.spooled.take(chunk)
        if not made.any():
            return spooled
        return pc.if_else(pa.array(made), pc.cast(lines(taken, schema), pa.large_binary()), spooled)


def _read_bucket(stems: list[Path]) -> tuple[_Spooled, Any]:
    """A bucket's spooled lines and index, and its Arrow rows (one chunk a column)."""
    import pyarrow as pa

    spooled = _Spooled(stems)
    tables = []
    for stem in stems:
        with pa.memory_map(str(stem.with_suffix(".ipc"))) as ipc:
            tables.append(pa.ipc.open_file(ipc).read_all())
    return spooled, pa.concat_tables(tables).combine_chunks()


def _index(stem: Path) -> tuple[Any, Any, int]:
    """A closed spool's line offsets (one more than rows: the end), sequence numbers, and the bytes of the lines
    of its rows made with Arrow."""
    import numpy as np

    data = stem.with_suffix(".idx").read_bytes()
    n, made = int.from_bytes(data[:8], "little"), int.from_bytes(data[8:16], "little")
    values = np.frombuffer(data, dtype=np.int64, offset=16)
    return values[: n + 1], values[n + 1 :], made


def lines_size(stem: Path) -> int:
    """The bytes a closed spool's rows take in the split's JSONL: its spooled lines and those made later."""
    with open(stem.with_suffix(".idx"), "rb") as idx:
        made = int.from_bytes(idx.read(16)[8:], "little")
    return stem.with_suffix(".spool").stat().st_size + made


def _offsets(array: Any) -> Any:
    """Where each value of a (large) string or binary Arrow array starts in its data buffer, and where the last
    ends (numpy int64)."""
    import numpy as np
    import pyarrow as pa

    large = pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if large else np.int32)
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
