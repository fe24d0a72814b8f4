"""What a PATH given to `flowrl ingest` / `flowrl watch` holds.

A PATH may be a toolboxv2 data dir (`{TB_DATA_DIR}/.data/<app>` or `TB_DATA_DIR` itself), an `Agents/`
dir, one agent's checkpoint dir, an obs dir, a store of rl_traces JSON, or single files. Directories are
walked recursively and files are recognised by name:

| file | kind |
|---|---|
| `agent_checkpoint_YYYYmmdd_HHMMSS.pkl`, `final_checkpoint.pkl` | checkpoint (V1 or V2, told apart by the \
pickled class) |
| `run_<id>.json` | obs run |
| `live_<id>*.jsonl` | obs live file |
| `*.json` inside a `YYYY-MM-DD` folder | trace (rl_traces or a flowrl store) |
| `*.json`, `*.jsonl`, `*.ndjson` whose first bytes hold `"resourceSpans"` | OTLP JSON traces (`flowrl.ingest.otlp`) |
| the same whose first line is a chat-completions request + response | OpenAI-format log (`flowrl.ingest.openai_logs`) |
| `*.json` holding a Langfuse ingestion batch with `score-create` events, or a scores export (`{"data": [{"traceId", \
"name", "value", "dataType"}]}`) | Langfuse scores (`flowrl.ingest.langfuse`), recorded as host outcomes |
| `*.pb`, `*.binpb` | OTLP protobuf traces |

A file named on the command line is taken whatever its name: `.pkl` is a checkpoint, `.pb`/`.binpb` OTLP
protobuf, `.jsonl` a live file unless its first bytes are OTLP or an OpenAI log, `.json` an obs run, OTLP,
Langfuse scores, an OpenAI log or a trace (by content). Content is sniffed only in regular files (never a FIFO
or device), from the first 64 KiB. Skipped while walking: `.staging`, `.git`, `__pycache__`, `node_modules`,
virtual environments, and the target store itself. A checkpoint dir
(`Agents/checkpoint/<agent>/`) also brings in its agent's obs dir (`Agents/<agent>/obs/`) so turns can
be joined to their runs.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from flowrl.errors import IngestError
from flowrl.ingest import langfuse, openai_logs, otlp_spans
from flowrl.ingest.checkpoint import CHECKPOINT_NAME_RE
from flowrl.ingest.obs import LIVE_FILE_RE, RUN_FILE_RE
from flowrl.ingest.openai_logs import Parsed
from flowrl.ingest.otlp import read_otlp

CHECKPOINT, OBS, LIVE, TRACE = "checkpoint", "obs", "live", "trace"
OTLP, OPENAI_LOG, LANGFUSE = "otlp", "openai-log", "langfuse-scores"
_SNIFFED = (".json", ".jsonl", ".ndjson")
_PROTOBUF = (".pb", ".binpb")
_DATE_DIR = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_PRUNE = {
    ".staging",
    ".git",
    "__pycache__",
    "node_modules",
    "site-packages",
    ".venv",
    ".venv-toolbox",
    ".tox",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
}


@dataclass(frozen=True)
class Format:
    """A file format told by its first bytes: `sniff` reads them, `read` turns the file into `Parsed` traces
    (None: Langfuse scores, which become host outcomes, `flowrl.ingest.engine.Ingestor`), `suffixes` are names
    taken as this format unread. A new format is its reader's file and one entry in FORMATS."""

    kind: str
    sniff: Callable[[bytes], bool]
    read: Callable[[Path, bytes | None], Parsed] | None
    suffixes: tuple[str, ...] = ()


FORMATS: tuple[Format, ...] = (  # sniffed in this order
    Format(OTLP, otlp_spans.sniff, read_otlp, suffixes=_PROTOBUF),
    Format(LANGFUSE, langfuse.sniff, None),
    Format(OPENAI_LOG, openai_logs.sniff, openai_logs.read_openai_log),
)


def reader(kind: str) -> Callable[[Path, bytes | None], Parsed] | None:
    """The reader of a format in FORMATS that yields traces (None: another kind of source)."""
    return next((f.read for f in FORMATS if f.kind == kind), None)


def _by_suffix(name: str) -> str | None:
    return next((f.kind for f in FORMATS if f.suffixes and name.endswith(f.suffixes)), None)


@dataclass(frozen=True)
class Source:
    kind: str
    path: Path
    explicit: bool = False  # named on the command line: an unreadable file is reported, never ignored
    problem: str | None = None  # why a named file cannot be read at all (reported as rejected)


def sniff(path: Path) -> str | None:
    """The kind of the first format in FORMATS whose `sniff` knows a regular file's first bytes (None: none, or
    the file cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.read(fd, openai_logs.SNIFF_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return next((f.kind for f in FORMATS if f.sniff(head)), None)


def classify(path: Path) -> str | None:
    """The kind of a file found while walking, from its name, and for JSON files not FlowAgent's own,
    their first bytes (None: not ours)."""
    name = path.name
    if name.endswith(".pkl"):
        return CHECKPOINT if CHECKPOINT_NAME_RE.match(name) else None
    if name.startswith("."):
        return None
    if (kind := _by_suffix(name)) is not None:
        return kind
    if name.endswith(".jsonl") and LIVE_FILE_RE.match(name):
        return LIVE
    if name.endswith(".json"):
        if RUN_FILE_RE.match(name):
            return OBS
        if _DATE_DIR.match(path.parent.name):
            return TRACE
    if name.endswith(_SNIFFED) and not name.endswith(".meta.json") and name != "_index.json":
        return sniff(path)
    return None


def classify_explicit(path: Path) -> str:
    name = path.name
    if name.endswith(".pkl"):
        return CHECKPOINT
    if (kind := _by_suffix(name)) is not None:
        return kind
    if name.endswith(".meta.json"):
        raise IngestError(f"{path}: a checkpoint's .meta.json sidecar holds no turns: give the .pkl next to it")
    if name.endswith(".json") and RUN_FILE_RE.match(name):
        return OBS
    if name.endswith(_SNIFFED):
        kind = sniff(path)
        if kind is not None:
            return kind
    if name.endswith(".jsonl"):
        return LIVE
    if name.endswith(".json"):
        return TRACE
    if name.endswith(".ndjson"):
        raise IngestError(f"{path}: neither OTLP JSON traces nor an OpenAI chat-completions log")
    raise IngestError(f"{path}: not a file flowrl reads (expected .pkl, .json, .jsonl, or OTLP .pb/.binpb/.ndjson)")


def _companion_obs(directory: Path) -> Path | None:
    """`Agents/checkpoint/<agent>/` -> `Agents/<agent>/obs/` when it exists."""
    if directory.parent.name == "checkpoint":
        obs = directory.parent.parent / directory.name / "obs"
        if obs.is_dir():
            return obs
    return None


def _under(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def walk(directory: Path, exclude: Iterable[Path] = (), skip_files: frozenset[Path] = frozenset()) -> Iterator[Source]:
    excluded = {Path(os.path.abspath(p)) for p in exclude}
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d not in _PRUNE and Path(os.path.abspath(here / d)) not in excluded)
        for name in sorted(filenames):
            path = here / name
            kind = classify(path)
            if kind is not None and (not skip_files or Path(os.path.abspath(path)) not in skip_files):
                yield Source(kind, path)


def resolve_roots(paths: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """(directories to walk, files named explicitly). Raises IngestError for a path that does not exist.

    Directories nested in another given directory are dropped (the outer walk covers them); a checkpoint
    dir adds its agent's obs dir."""
    dirs: list[Path] = []
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise IngestError(f"{raw}: no such file or directory")
        if path.is_dir():
            dirs.append(Path(os.path.abspath(path)))
            companion = _companion_obs(path)
            if companion is not None:
                dirs.append(Path(os.path.abspath(companion)))
        else:
            files.append(Path(os.path.abspath(path)))
    dirs = sorted(set(dirs))
    dirs = [d for d in dirs if not any(d != o and _under(d, o) for o in dirs)]
    return dirs, sorted(set(files))


def iter_sources(paths: Iterable[Path], exclude: Iterable[Path] = ()) -> Iterator[Source]:
    """Every source under the given paths, each once, lazily (the walk holds no list of files)."""
    dirs, files = resolve_roots(paths)
    for f in files:
        try:
            yield Source(classify_explicit(f), f, explicit=True)
        except IngestError as exc:
            yield Source("unsupported", f, explicit=True, problem=str(exc))
    skip = frozenset(files)
    for d in dirs:
        yield from walk(d, exclude, skip)
