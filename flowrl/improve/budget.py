"""How much one round of `flowrl improve` trains: rows per optimizer step and steps, from the size of the round's
set alone, so a CPU and a GPU take the same steps (issue 37).

The hardware profile used to pick the batch: 4 rows a step on a CPU, 32 on a GPU (8 x 4 accumulation). Round 1
of the benchmark selected 9 runs, and 3 epochs were 9 optimizer steps on a CPU and 1 on a GPU at the same
learning rate; a round that selected 175 runs trained about 130 steps (40 minutes on 2 cores), while 6 steps had
reached 50.7% held-out.

`round_budget(rows, epochs)`:
- rows per step: 4 x round(rows / 32), at least 4 and at most 32 (about 8 steps an epoch from 32 rows up;
  a multiple of 4 splits into any profile's micro-batches: `TrainingConfig.effective_batch_size`);
- steps: `epochs` passes over the set (an epoch is ceil(rows / rows per step) steps, as the trainer counts it),
  rounded up, at most `MAX_STEPS` (48: 1,536 rows, 1.5 epochs of a set of 1,000).

`grpo_budget(groups, group_size)`: about `GROUPS_PER_STEP` (4) groups a step (batches of even size),
`GRPO_ITERATIONS` (2) optimizer steps on each batch of rollouts, one pass over the round's groups, at most `MAX_STEPS`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["GRPO_ITERATIONS", "GROUPS_PER_STEP", "MAX_STEPS", "Budget", "grpo_budget", "round_budget"]

MAX_STEPS = 48
GROUPS_PER_STEP = 4  # GRPO: groups (prompts) in one optimizer step, so one task's noise does not set the step
GRPO_ITERATIONS = 2  # GRPO: optimizer steps on each batch of rollouts (TRL's num_iterations; the ratio is clipped)
_ROWS_PER_STEP = (4, 32)


@dataclass(frozen=True)
class Budget:
    rows: int  # rows in the round's training set
    effective_batch: int  # rows per optimizer step, on every machine
    steps: int  # optimizer steps
    capped: bool  # fewer steps than the epochs asked (MAX_STEPS, or the user's max_steps)

    @property
    def epochs(self) -> float:
        """Passes over the set the steps make."""
        return self.steps / _steps_per_epoch(self.rows, self.effective_batch)

    def describe(self) -> str:
        cap = ", capped" if self.capped else ""
        return f"{self.steps} steps of {self.effective_batch} rows ({self.epochs:.1f} epochs of {self.rows}{cap})"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "epochs": round(self.epochs, 3)}


def _steps_per_epoch(rows: int, batch: int) -> int:
    return max(1, math.ceil(rows / batch))  # as the trainer counts them: the last batch may be short


def round_budget(rows: int, epochs: float, max_steps: int | None = None) -> Budget:
    """The budget for a set of `rows` rows trained `epochs` times (see the module doc); `max_steps` replaces the
    epochs' count (the user's `--max-steps`)."""
    low, high = _ROWS_PER_STEP
    batch = min(high, max(low, 4 * round(rows / 32)))
    wanted = max(1, math.ceil(epochs * _steps_per_epoch(rows, batch)))
    if max_steps is not None:
        return Budget(rows, batch, max_steps, capped=max_steps < wanted)
    return Budget(rows, batch, min(wanted, MAX_STEPS), capped=wanted > MAX_STEPS)


def grpo_budget(groups: int, group_size: int, max_steps: int | None = None) -> Budget:
    """A GRPO round: about `GROUPS_PER_STEP` groups of `group_size` runs a step, the round's groups cut into
    batches of even size (5 groups are one batch of 5, not 4 and then 1 padded with 3 groups seen already), each
    batch of rollouts used for `GRPO_ITERATIONS` steps, one pass over the round's groups (they were sampled by
    the policy that starts the round: on-policy data is used once), at most `MAX_STEPS`."""
    batches = max(1, round(groups / GROUPS_PER_STEP))
    per_step = math.ceil(groups / batches)  # batches of even size: a short last one would be filled with repeats
    wanted = batches * GRPO_ITERATIONS
    rows = groups * group_size
    if max_steps is not None:
        return Budget(rows, per_step * group_size, max_steps, capped=max_steps < wanted)
    return Budget(rows, per_step * group_size, min(wanted, MAX_STEPS), capped=wanted > MAX_STEPS)
