"""`load_checkpoint`: one FlowAgent checkpoint file, unpickled (restricted) and read by its version's reader.

The readers (`checkpoint_v1`, `checkpoint_v2`) share the model in `checkpoint`; this module sits above the
three, so they import one way.
"""

from __future__ import annotations

from pathlib import Path

from flowrl.errors import IngestError
from flowrl.ingest.checkpoint import Checkpoint
from flowrl.ingest.checkpoint_v1 import read_v1
from flowrl.ingest.checkpoint_v2 import read_v2
from flowrl.ingest.unpickler import V1Checkpoint, V2Checkpoint, load_restricted, loads_restricted


def load_checkpoint(path: Path, raw: bytes | None = None) -> Checkpoint:
    """Unpickle one checkpoint file (restricted) and read it. Raises IngestError / UnsafePickleError."""
    path = Path(path)
    obj = load_restricted(path) if raw is None else loads_restricted(raw, origin=str(path))
    if isinstance(obj, V2Checkpoint):
        return read_v2(path, obj)
    if isinstance(obj, V1Checkpoint):
        return read_v1(path, obj)
    raise IngestError(
        f"{path}: not a FlowAgent checkpoint (the pickle holds a {type(obj).__name__}, not an AgentCheckpoint)"
    )
