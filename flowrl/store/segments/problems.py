"""What one operation on a segment store could not read: the same record `TraceStore` keeps, per thread
(`flowrl.store.ProblemRecords`). `with store.operation() as op:` groups listings into one operation; outside one,
each listing starts a fresh record and `store.problems` is the latest one's. Each unreadable object is recorded
(and logged) once.
"""

from __future__ import annotations

from flowrl.store.files import ProblemRecords as _StoreProblems
from flowrl.store.files import _Operations


class ProblemRecords(_StoreProblems):
    """`TraceStore`'s problem records, for a store that is not a dataclass."""

    def __init__(self) -> None:
        self._ops = _Operations()
