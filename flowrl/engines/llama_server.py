"""llama.cpp's own server (`llama-server`) as flowrl's engine on a CPU: several sequences decoded per step.

`LlamaServer(gguf, adapters={...})` is a service with a lifetime (a context manager): it starts the binary on
127.0.0.1 with a free port, waits for `/health`, and stops it on exit, on Ctrl-C, at interpreter exit, and when
this process dies (the child gets SIGTERM from the kernel then: `PR_SET_PDEATHSIG`). Its log is a file; a start
that fails says so in one line with the log's last lines. It runs with `OMP_WAIT_POLICY=PASSIVE` unless the
environment sets another: llama.cpp's OpenMP threads spin while they wait, and on a machine where another
process takes a core that collapsed decoding (4 sequences: 2 new tokens/s spinning, 33 passive).

What flowrl asks of it, on `/completion`:
* the prompt as token ids, rendered by the model's own Hugging Face tokenizer (`flowrl.engines.chat_backend`),
  so what the model saw is exactly what training renders; the reply as token ids (`return_tokens`), end-of-turn
  token included, with each sampled token's log-probability (`n_probs`);
* sampling per request: temperature, then top-k and top-p on the scaled logits (the order transformers and
  flowrl's other engines use), min-p off, no repetition penalty, a seed per request. The log-probability is the
  one the sampled token had in the distribution it was drawn from (softmax(logits / T) over the top-k / top-p
  candidates: `post_sampling_probs`); greedy requests (T = 0) get softmax(logits) at T = 1, as before;
* the LoRA adapter per request: every adapter is loaded beside the base model at start (`--lora`, scale 0), a
  request names one (`lora: [{id, scale: 1}]`), and requests with the same adapter are batched together.
  llama-server loads adapters only at start (its `/lora-adapters` sets scales, not files), so `set_adapters`
  restarts it with the new list: the base model is read again (page-cached; about a second for 135M,
  `bench/bench_engine.py` measures it).

The binary: `$FLOWRL_LLAMA_SERVER`, else `llama-server` beside this Python (`make setup` builds it there from the
llama.cpp sources in the llama-cpp-python sdist: `python -m flowrl.engines.llama_server_build`), else on PATH.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError, FlowRLError

log = logging.getLogger(__name__)

BINARY_ENV = "FLOWRL_LLAMA_SERVER"
BUILD_HINT = (
    "build it with `python -m flowrl.engines.llama_server_build` (make setup does), or set $FLOWRL_LLAMA_SERVER"
)
START_TIMEOUT_S = 120.0


class EngineError(FlowRLError):
    """The engine failed (it died, or answered with an error)."""


class EngineRefused(EngineError):
    """The engine refused the request as it was (HTTP 400: a prompt longer than a slot's context, say): the
    client's to change, not a failure of the engine."""


@dataclass(frozen=True)
class Sampling:
    """How one request samples. `temperature` 0 is greedy."""

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0  # 0: the whole vocabulary
    max_tokens: int = 512
    seed: int | None = None


@dataclass(frozen=True)
class Generated:
    """A reply from the engine: sampled ids (end-of-turn token included when the model ended its turn), their
    log-probabilities (None when llama-server did not give one for every token: see `generate`), and why it
    stopped (`stop`: the model's end of turn; `length`: `max_tokens`)."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish: str


def find_binary() -> Path:
    """The llama-server binary to run (see the module docstring), or one line naming how to get it."""
    given = os.environ.get(BINARY_ENV)
    if given:
        path = Path(given).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(f"${BINARY_ENV}={given} is not an executable file: {BUILD_HINT}")
        return path
    beside = Path(sys.prefix) / "bin" / "llama-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    raise ConfigError(f"no llama-server binary (looked at {beside} and on PATH): {BUILD_HINT}")


def available() -> bool:
    try:
        find_binary()
    except ConfigError:
        return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the process that started it dies (Linux), so a killed flowrl
    leaves no server behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: atexit and the context manager still stop it
        pass


class LlamaServer:
    """One llama-server process: the base model `gguf` and the LoRA `adapters` (name -> GGUF adapter file).

    `slots` sequences are decoded together, each with `ctx_per_slot` tokens of context; `threads` defaults to
    the cores. Safe to call `generate` from many threads at once: that is how batching happens."""

    def __init__(  # noqa: PLR0913  # keyword-only server options
        self,
        gguf: str | Path,
        *,
        adapters: dict[str, Path] | None = None,
        slots: int = 8,
        ctx_per_slot: int = 4096,
        threads: int | None = None,
        binary: Path | None = None,
        log_path: Path | None = None,
        timeout: float = 600.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.gguf = Path(gguf)
        if not self.gguf.is_file():
            raise ConfigError(f"{self.gguf} does not exist: pass a GGUF model file")
        self.binary = binary or find_binary()
        self.adapters: dict[str, Path] = dict(adapters or {})
        self.slots, self.ctx_per_slot = max(1, slots), ctx_per_slot
        self.threads = threads or os.cpu_count() or 1
        self.log_path = log_path
        self.timeout = timeout
        self.extra_args = tuple(extra_args)  # more llama-server flags, e.g. ("-fa", "off")
        self.port = 0
        self.restarts = 0
        self.replies_without_logprobs = 0  # see `generate`
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        self._lock = threading.RLock()  # start/stop/restart against requests reading the port
        self._in_flight = 0
        self._swapping = False
        self._idle = threading.Condition(self._lock)

    # -- lifetime ---------------------------------------------------------------------------------------------
    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        cmd = [
            str(self.binary),
            "-m",
            str(self.gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-np",
            str(self.slots),
            "-c",
            str(self.slots * self.ctx_per_slot),
            "-t",
            str(self.threads),
            "-tb",
            str(self.threads),
            "--no-webui",
            "--no-warmup",
            "--cont-batching",
            # flash attention off: on this CPU it decoded example-agent runs at 46 new tokens/s against 61 without,
            # and without it the logprobs are llama-cpp-python's (tests/test_engine_llama_server.py)
            "-fa",
            "off",
        ]
        for path in self.adapters.values():
            cmd += ["--lora", str(path)]
        if self.adapters:
            cmd.append("--lora-init-without-apply")  # scale 0 unless a request names it
        return cmd + list(self.extra_args)

    def start(self) -> None:
        with self._lock:
            if self.running:
                return
            self.port = free_port()
            if self.log_path is not None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log_file = open(self.log_path, "a+b")  # noqa: SIM115 - closed in stop()
            else:
                import tempfile

                self._log_file = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
            started = time.monotonic()
            # OpenMP threads that spin while they wait collapse when another process takes a core: 4 sequences
            # decoded at 2 new tokens/s beside a compile job, 33 with PASSIVE (bench/bench_engine.py has both)
            env = dict(os.environ)
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            self._proc = subprocess.Popen(
                self.command(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
                start_new_session=True,  # Ctrl-C reaches flowrl, which stops the server itself
            )
            atexit.register(self.stop)
            try:
                self._wait_healthy(started)
            except BaseException:
                self.stop()
                raise
            log.info(
                "llama-server on %s: %s, %d slots (%.1f s to start)",
                self.url,
                self.gguf.name,
                self.slots,
                time.monotonic() - started,
            )

    def _wait_healthy(self, started: float) -> None:
        while time.monotonic() - started < START_TIMEOUT_S:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise EngineError(
                    f"llama-server exited with code {self._proc.returncode} while starting on {self.gguf}: "
                    f"{self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise EngineError(f"llama-server did not become healthy within {START_TIMEOUT_S:.0f} s: {self._log_tail()}")

    def _log_tail(self, lines: int = 5) -> str:
        if self._log_file is None:
            return "(no log)"
        try:
            self._log_file.flush()
            self._log_file.seek(0)
            text = self._log_file.read()[-8192:].decode(errors="replace")
        except (OSError, ValueError):
            return "(log unreadable)"
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            atexit.unregister(self.stop)

    def set_adapters(self, adapters: dict[str, Path]) -> float:
        """Serve exactly `adapters` (name -> GGUF adapter) from now on; returns the seconds the swap took (a
        restart, after the requests in flight finish: see the module docstring)."""
        started = time.monotonic()
        with self._lock:
            self._swapping = True  # new requests wait for the swap
            try:
                while self._in_flight:
                    self._idle.wait()
                was_running = self.running
                self.stop()
                self.adapters = dict(adapters)
                if was_running:
                    self.start()
                    self.restarts += 1
            finally:
                self._swapping = False
                self._idle.notify_all()
        return time.monotonic() - started

    # -- requests ---------------------------------------------------------------------------------------------
    def _lora(self, adapter: str | None) -> list[dict[str, Any]]:
        if adapter is not None and adapter not in self.adapters:
            raise ConfigError(f"adapter {adapter!r} is not loaded (loaded: {', '.join(self.adapters) or 'none'})")
        return [{"id": i, "scale": 1.0 if name == adapter else 0.0} for i, name in enumerate(self.adapters)]

    def generate(self, prompt: list[int], sampling: Sampling, adapter: str | None = None) -> Generated:
        """The reply to `prompt` (token ids) under `sampling`, with `adapter` (a name given at start) or the
        base model (None)."""
        greedy = sampling.temperature <= 0
        body: dict[str, Any] = {
            "prompt": [int(i) for i in prompt],
            "n_predict": sampling.max_tokens,
            "temperature": max(0.0, sampling.temperature),
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": 0.0,
            "typical_p": 1.0,
            "repeat_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "samplers": ["temperature", "top_k", "top_p"],
            "cache_prompt": True,
            "return_tokens": True,
            "n_probs": 1,
            "post_sampling_probs": not greedy,
            "lora": self._lora(adapter),
        }
        if sampling.seed is not None:
            body["seed"] = int(sampling.seed) & 0xFFFFFFFE  # LLAMA_DEFAULT_SEED (0xFFFFFFFF) means random
        reply = self._post("/completion", body)
        tokens = [int(t) for t in reply.get("tokens") or []]
        finish = "length" if reply.get("stop_type") == "limit" else "stop"
        return Generated(tokens, self._logprobs(tokens, reply.get("completion_probabilities") or [], greedy), finish)

    def _logprobs(self, tokens: list[int], probs: list[dict[str, Any]], greedy: bool) -> list[float] | None:
        """Each sampled token's log-probability, matched to the tokens by id. llama-server leaves out a token
        whose text ends inside a UTF-8 character (it records probabilities only for text it has sent): such a
        reply gets None rather than a guess, said once and counted in `replies_without_logprobs`."""
        import math

        values: list[float] = []
        j = 0
        for token in tokens:
            if j < len(probs) and int(probs[j].get("id", -1)) == token:
                p = probs[j]
                values.append(float(p["logprob"]) if greedy else (math.log(p["prob"]) if p["prob"] > 0 else -math.inf))
                j += 1
        if j != len(probs):
            raise EngineError(
                f"llama-server returned probabilities for tokens it did not sample ({len(probs)} for {len(tokens)})"
            )
        if len(values) == len(tokens):
            return values
        self.replies_without_logprobs += 1
        if self.replies_without_logprobs == 1:
            log.warning(
                "llama-server gave no probability for %d of %d tokens of a reply (tokens ending inside a UTF-8 "
                "character): such replies are returned without logprobs (counted in replies_without_logprobs)",
                len(tokens) - len(values),
                len(tokens),
            )
        return None

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            while self._swapping:
                self._idle.wait()
            if not self.running:
                raise EngineError(f"llama-server is not running ({self._log_tail()})")
            url = self.url + path
            self._in_flight += 1
        try:
            request = urllib.request.Request(
                url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return dict(json.loads(response.read()))
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:500]
                kind = EngineRefused if exc.code == 400 else EngineError
                raise kind(f"llama-server answered {exc.code} on {path}: {detail}") from exc
            except (urllib.error.URLError, OSError) as exc:
                raise EngineError(f"llama-server on {url} failed ({exc}): {self._log_tail()}") from exc
        finally:
            with self._lock:
                self._in_flight -= 1
                self._idle.notify_all()
