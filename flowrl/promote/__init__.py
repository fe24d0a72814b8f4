"""Promotion: put a candidate model in front of users only when a paired test on held-out tasks says it is better
than what serves now (issue 38).

- `flowrl.promote.decide`: the rule (McNemar p below alpha and the paired difference's 95% interval above 0), the
  power check of a held-out set, the check that the candidate never trained on a held-out task;
- `flowrl.promote.history`: `promotions.jsonl`, the append-only record of every decision, what is promoted now,
  and rollback;
- `flowrl.promote.run`: one promotion (evaluate both models, decide, record);
- `flowrl.promote.follow`: a served name that follows the record (`flowrl serve --promotions`).
"""

from __future__ import annotations

from flowrl.promote.decide import Decision, decide, leaked_tasks, power_problem
from flowrl.promote.history import Entry, History

__all__ = ["Decision", "Entry", "History", "decide", "leaked_tasks", "power_problem"]
