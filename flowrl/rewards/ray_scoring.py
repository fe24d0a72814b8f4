"""score_store_ray: `flowrl score --ray`, the reward engine on Ray Data workers, the store written by the driver.

The driver is `score_store` itself with a `RayBackend` (`flowrl.rewards.scoring.ScoringBackend`), which only
moves the computing: it reads the store through its API (`store.iter_traces()`, so a JSON store and a segment
store alike), counts and picks the traces to score (`consider`: missing rewards, outcomes recorded since,
`--all`), lets learned rewards fit on the manual labels (`engine.prepare`), and packs whole task groups into
batches (`pack`). Each batch goes to the workers as one row: the traces as their stored JSON (`flowrl.store.dumps`,
loaded back with `load_trace`) and their host outcomes (side records that a trace's JSON leaves out).

The workers are a pool of `ScoreWorker` actors (`map_batches` with `ActorPoolStrategy(size=N)`, `--ray-workers
N`). Each builds ONE `RewardEngine` from the driver's loaded config, and so one code sandbox, kept for every batch
it gets; rewards the driver prepared (a fitted learned reward) are sent to it as the driver's fitted copies. A
worker computes and returns the results; it never touches the store.

The results come back to the driver, which counts them (`Tally`: the error budget, stopping early once it
cannot be met), and, when within budget, writes them itself (`write_back`: each trace read again by id right
before `store.update`, so a manual label given meanwhile survives). One writer: no two workers write the store.

`address` None (or "local") starts a Ray on 127.0.0.1 with one CPU per worker, and stops it; "ray://host:port" or
"host:port" connects to a running cluster (flowrl must be installed there), and disconnects after. A Ray the
caller already started in this process is used as it is and left running. Nothing here imports ray until it is
called.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
from collections.abc import Callable, Generator, Iterator
from types import ModuleType
from typing import Any

import orjson

from flowrl.errors import ConfigError, MissingExtraError, SchemaError
from flowrl.rewards.base import Reward
from flowrl.rewards.config import EngineConfig
from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.scoring import Row, ScoreSummary, Work, pack, score_store
from flowrl.store.files import TraceStore, dumps
from flowrl.trace.load import load_trace
from flowrl.trace.outcomes import HostOutcome
from flowrl.trace.schema import ExecutionTrace

LOCAL = "local"  # `--ray` without an address: a Ray of our own on 127.0.0.1
# what makes every socket of a local Ray listen on 127.0.0.1 only, and keeps it from reporting usage
LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def import_ray() -> ModuleType:
    """`ray`, with Ray Data; MissingExtraError naming the fix when it is not installed."""
    try:
        import ray
        import ray.data  # noqa: F401  # the part `--ray` uses; a bare `ray` install lacks its dependencies
    except ImportError as exc:
        raise MissingExtraError(
            f"--ray needs Ray Data, which is not installed: run `pip install 'ray[data]'` ({exc})"
        ) from exc
    return ray


# -- the wire: traces to the workers, results back -------------------------------------------------------------
def encode_trace(trace: ExecutionTrace) -> tuple[bytes, bytes]:
    """A trace as it travels to a worker: its stored JSON and its host outcomes (not part of that JSON)."""
    return dumps(trace), orjson.dumps([o.model_dump(mode="json") for o in trace.outcomes])


def decode_trace(trace_json: bytes, outcomes_json: bytes) -> ExecutionTrace:
    """The trace `encode_trace` sent, outcomes attached as the store attaches them when it reads a trace."""
    trace = load_trace(orjson.loads(trace_json), origin="a trace sent to a Ray worker")
    trace.outcomes = [HostOutcome.model_validate(o) for o in orjson.loads(outcomes_json)]
    return trace


class ScoreWorker:
    """A Ray Data actor: one RewardEngine (one sandbox) for every batch it scores; never writes the store.

    Takes rows of `payload` (a pickled list of `encode_trace` pairs, one whole batch of task groups) and returns
    one row per trace: its id, its pickled `Results` (exact, as the engine made them), or an error message when
    the trace could not be loaded."""

    def __init__(self, config: EngineConfig, prepared: dict[str, Reward]) -> None:
        self.engine = RewardEngine.from_engine_config(config)
        self.engine.rewards.update(prepared)  # fitted on the driver, on the store's manual labels

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        ids: list[str] = []
        results: list[bytes | None] = []
        errors: list[str | None] = []
        for payload in batch.column("payload").to_pylist():
            traces: list[ExecutionTrace] = []
            for trace_json, outcomes_json in pickle.loads(payload):
                try:
                    traces.append(decode_trace(trace_json, outcomes_json))
                except SchemaError as exc:
                    ids.append(str(orjson.loads(trace_json).get("trace_id", "?")))
                    results.append(None)
                    errors.append(str(exc))
            for trace, computed in zip(traces, self.engine.compute_batch(traces)):
                ids.append(trace.trace_id)
                results.append(pickle.dumps(computed))
                errors.append(None)
        return pa.table(
            {
                "trace_id": pa.array(ids, pa.string()),
                "results": pa.array(results, pa.binary()),
                "error": pa.array(errors, pa.string()),
            }
        )

    def __del__(self) -> None:  # Ray Data drops the actor's UDF when the pool shuts down gracefully
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()


# -- the driver -------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def ray_session(ray: ModuleType, address: str | None, num_cpus: int) -> Iterator[None]:
    """Ray for one scoring run: a running one of this process as it is, else a local one on 127.0.0.1 (address
    None or "local") or the cluster at `address`; what this started is stopped (or disconnected) after."""
    if ray.is_initialized():
        yield
        return
    if address in (None, LOCAL):
        saved = {name: os.environ.get(name) for name in LOCAL_ENV}
        os.environ.update(LOCAL_ENV)  # read by the head's processes as they start
        try:
            ray.init(
                address="local",  # never an existing cluster that RAY_ADDRESS or a running head points at
                num_cpus=num_cpus,
                _node_ip_address="127.0.0.1",
                include_dashboard=False,
                log_to_driver=False,
            )
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    else:
        ray.init(address=address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _prepared(engine: RewardEngine) -> dict[str, Reward]:
    """The rewards that learn from the store (have `prepare`), as the driver fitted them, for the workers."""
    return {name: r for name, r in engine.rewards.items() if callable(getattr(r, "prepare", None))}


def _rows(batch: Any) -> list[Row[str]]:
    """A worker's output block as (trace id, results, error) items for `Tally.add`."""
    out: list[Row[str]] = []
    for trace_id, results, error in zip(
        batch.column("trace_id").to_pylist(), batch.column("results").to_pylist(), batch.column("error").to_pylist()
    ):
        out.append((trace_id, None if results is None else pickle.loads(results), error))
    return out


class RayBackend:
    """`score_store`'s backend for Ray (see the module's doc): the store read through its API, the traces sent to a
    pool of `ray_workers` `ScoreWorker` actors as their JSON, and read again by id for the write."""

    def __init__(self, ray: ModuleType, address: str | None, ray_workers: int) -> None:
        self.ray, self.address, self.ray_workers = ray, address, ray_workers

    def select(
        self, store: TraceStore, problems: list[str], pick: Callable[[ExecutionTrace], bool]
    ) -> Iterator[tuple[ExecutionTrace, tuple[bytes, bytes]]]:
        with store.operation() as skipped:
            for trace in store.iter_traces():
                if pick(trace):
                    yield trace, encode_trace(trace)
        problems.extend(p.message for p in skipped)

    def compute(self, work: Work[tuple[bytes, bytes]]) -> Generator[list[Row[str]], None, None]:
        ray, todo = self.ray, work.todo
        size = max(1, min(work.batch_size, math.ceil(len(todo) / self.ray_workers)))  # a small run reaches each
        payloads = [pickle.dumps(batch) for batch in pack(todo, size)]
        todo.clear()  # score_store's list: the encoded traces live on in the payloads only
        if not payloads:
            return
        with ray_session(ray, self.address, num_cpus=self.ray_workers):
            context = ray.data.DataContext.get_current()
            context.enable_progress_bars = False  # the caller shows progress (`flowrl score`: its own bar)
            quiet = logging.getLogger("ray.data")
            level = quiet.level
            quiet.setLevel(logging.WARNING)  # not Ray Data's line per execution in the command's output
            ds = ray.data.from_items([{"payload": p} for p in payloads], override_num_blocks=len(payloads))
            payloads.clear()
            scored = ds.map_batches(
                ScoreWorker,
                fn_constructor_kwargs={"config": work.engine.config, "prepared": _prepared(work.engine)},
                compute=ray.data.ActorPoolStrategy(  # up to `workers` batches at once per worker, as in one process
                    size=self.ray_workers,
                    max_concurrent_calls_per_actor=max(1, work.workers),
                    enable_true_multi_threading=True,
                ),
                batch_size=1,
                batch_format="pyarrow",
            )
            try:
                for block in scored.iter_batches(batch_size=None, batch_format="pyarrow"):
                    yield _rows(block)
                    if work.stop():  # the budget is blown: nothing will be written
                        break
            finally:
                quiet.setLevel(level)

    def reread(self, store: TraceStore, key: str) -> ExecutionTrace:
        return store.get(key)


def score_store_ray(
    store: TraceStore, engine: RewardEngine, address: str | None = None, ray_workers: int = 2, **options: Any
) -> ScoreSummary:
    """`score_store` with the computing on `ray_workers` Ray actors; same selection, records, labels and error
    budget (ErrorBudgetExceeded, nothing written). `options` are `score_store`'s keywords (`rescore_all`,
    `progress`, `workers`, `batch_size`, `max_error_rate`). Each Ray worker scores up to `workers` batches at once
    (threads sharing its engine, as `score_store`'s do), and `workers` threads write the results back on the driver.

    `engine` must come from `RewardEngine.from_config` (each worker builds its own from the same config)."""
    if engine.config is None:
        raise ConfigError("scoring on Ray builds each worker's engine from a config: use RewardEngine.from_config")
    if ray_workers < 1:
        raise ConfigError(f"ray_workers must be at least 1, got {ray_workers}")
    return score_store(store, engine, backend=RayBackend(import_ray(), address, ray_workers), **options)
