"""The continuous-batching decode engine behind ``steerkit serve``: one loop, in one background thread, decodes
every running row; a submitted row joins the batch at the next step and leaves it when it finishes, is
cancelled or times out.

The contract the HTTP layer codes against (issue 14)::

    engine = Engine(lm, tokenizer, {"toxicity": reward}, default_rewards={"toxicity": -5}, default_k=20,
                    max_running=16, max_queue=64, observer=metrics)     # or Engine.from_config(config)
    engine.start()
    engine.validate(spec)            # typed steerkit errors, raised at once; each carries .param (the field)
    handle = engine.submit(spec)     # validate + enqueue; ServerBusyError (-> 429) when the queue is full,
                                     # ServerShuttingDownError (-> 503) after shutdown() began
    handles = engine.submit_all(specs)   # n > 1: all rows are queued, or none (ServerBusyError)
    async for event in handle.events(): ...   # TokenEvent ..., then one FinishEvent
    handle.cancel()                  # the row leaves the batch at the next step
    engine.stats(); engine.reward_names(); engine.model_name; engine.tokenizer; engine.lm
    engine.observer = metrics        # may also be set after construction, before start()
    handle.result(timeout)           # outside an event loop: the collected Completion (scripts, tests)
    engine.shutdown(deadline_s)      # stop admitting; finish rows in flight until the deadline; cancel the rest

Per step (:meth:`Engine._step`): the LM's next-token logits of every row (kept from the previous forward, or
from a newcomer's prefill), the top-K at the largest k of the batch, each reward scored only on the rows that
use it (:mod:`.reward_groups`), each row's choice with its own k, β, temperature and generator
(:mod:`.sampling`), events out, sessions committed, finished rows dropped, one LM forward for the rest.

**Contract with** :func:`steerkit.generate`: a row with seed ``s`` draws what
``generate([prompt], lm=(lm, tokenizer), rewards=..., k=..., temperature=..., seed=s, max_new_tokens=...)``
draws (``do_sample=False`` for temperature 0): the same prefill (each prompt apart from the running rows; newcomers
of one pass share padded forwards), the same maths and
the same random stream. Its tokens are equal whenever batched float arithmetic gives the row the same logits
and rewards as running alone (docs/serving.md, "Determinism": the measured drift and mismatch counts). The
text differs in one way: a stop string ends the completion *before* the stop string (OpenAI), where
``generate`` keeps it.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from typing import Mapping, Protocol, Sequence

from ..compiling import new_shapes_run_eagerly
from ..decoding import eos_ids
from ..engine.core import EngineCore
from ..engine.rows import Row
from ..errors import ServerBusyError, ServerShuttingDownError
from ..models import context_length, text_config
from ..steering import LARGE_K
from ..validators import validate_int, validate_k
from .requests import (COMPILE_TOKENS, DEFAULT_MAX_QUEUE, DEFAULT_MAX_RUNNING, PREFILL_CHUNK, FinishEvent, RowHandle,
                       RowSpec, TokenEvent)
from .row_terms import RewardLookup, row_terms
from .prefill import Prefills
from .validation import check_cost, prepare_rows

#: How long the idle loop sleeps between checks for new rows, cancellations and deadlines (seconds).
IDLE_WAIT_S = 0.05


#: An LM whose KV cache is sized up front (llama.cpp, ``--engine llama.cpp``) reserves at most this many tokens over
#: all running rows: 2,048 a row at the default 16 rows (SmolLM2-135M: 23 KB a token in f16, 0.75 GB in all). The
#: row's share is ``limits.context_tokens``; a longer request is a 400.
KV_BUDGET_TOKENS = 32768


class EngineObserver(Protocol):
    """What the engine reports (the HTTP layer's metrics implement it). Called from the decode-loop thread;
    an observer that raises is ignored."""

    def on_step(self, seconds: float, running: int, queued: int) -> None: ...

    def on_reward(self, name: str, seconds: float) -> None: ...  # once per step per reward: score + commit

    def on_tokens(self, count: int) -> None: ...


class Engine:
    """See the module docstring. ``rewards`` maps the names requests use to ``Reward`` objects;
    ``default_rewards`` (the forms ``RowSpec.rewards`` takes) steers rows whose spec says ``rewards=None``."""

    def __init__(self, lm, tokenizer, rewards: Mapping[str, object] | None = None, *, default_rewards=(),
                 default_k: int = 20, max_running: int = DEFAULT_MAX_RUNNING,
                 max_queue: int = DEFAULT_MAX_QUEUE, observer=None,
                 model_name: str | None = None, max_k_sequence: int = LARGE_K, prefill_chunk: int = PREFILL_CHUNK,
                 compile_tokens: int = COMPILE_TOKENS):
        self.lm = lm.eval()
        self.tokenizer = tokenizer
        config = text_config(lm)
        self.vocab_size = config.vocab_size
        self.context = context_length(lm)
        self.eos = set(eos_ids(lm, tokenizer))
        self.lookup = RewardLookup(rewards or {})
        self.default_k = validate_k(default_k, self.vocab_size)
        self.default_rewards = default_rewards or None
        self.max_k_sequence = validate_int("max_k_sequence", max_k_sequence)
        self.prefill_chunk = validate_int("prefill_chunk", prefill_chunk)
        check_cost(self, row_terms(self.default_rewards, self.lookup), self.default_k,
                   "the default k")  # checked now (a bad default fails at start-up)
        self.max_running = validate_int("max_running", max_running)
        self.max_queue = validate_int("max_queue", max_queue, 0)
        self.observer = observer
        self.model_name = model_name or getattr(config, "_name_or_path", None) or type(lm).__name__
        self._core = EngineCore(self.lm, tokenizer, eos=self.eos, vocab_size=self.vocab_size,
                                names=lambda reward: _reward_name(reward, self.lookup))
        if self.context is not None:  # llama.cpp sizes its KV cache now, and may give a row fewer tokens
            self.context = self._core.batch.reserve(self.max_running, self.context, budget=KV_BUDGET_TOKENS)
        self._core.batch.prefill([tokenizer.eos_token_id or 0])  # an LM whose KV cache cannot be batched fails now
        self._prefills = Prefills(self._core.batch, self.prefill_chunk)
        self._queue: deque[Row] = deque()
        self._lock = threading.Condition()
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._accepting = True
        self._drain_deadline: float | None = None
        self._stopped = False
        self._counts = {"steps": 0, "tokens": 0, "finished": {}}
        self._progress = time.monotonic()  # when the loop last finished a step (or a prefill chunk), or went idle
        self._row_seconds: float | None = None  # moving average of a row's time in the engine
        warm_up = getattr(self._core.batch, "warm_up", None)
        if callable(warm_up):  # the compiled step (--compile): every row bucket of the LM and of the compiled rewards
            from .loading import warm_up_compiled_rewards  # compiled before a request waits on it

            tokens = min(validate_int("compile_tokens", compile_tokens), (self.context or 1 << 30) - 1)  # a row fits
            warm_up(self.max_running, tokenizer.eos_token_id or 0, tokens)
            warm_up_compiled_rewards(self, tokens)

    @classmethod
    def from_config(cls, steering_config=None, **limits) -> "Engine":
        """An engine for a :class:`~steerkit.config.SteeringConfig` (its LM, backend, device, rewards as the
        default steering, k), serving every installed reward plus the config's own. ``None``: the packaged
        SmolLM2, every installed reward, no default steering."""
        from .loading import engine_parts

        parts = engine_parts(steering_config)
        return cls(parts.lm, parts.tokenizer, parts.rewards, default_rewards=parts.default_rewards,
                   default_k=parts.k, model_name=parts.model_name, **limits)

    # -- what the HTTP layer calls -----------------------------------------------------------------------
    def reward_names(self) -> list[str]:
        return self.lookup.names()

    def limits(self) -> dict:
        """What a row may ask of this engine: k (with and without a sequence reward), the prompt's tokens, and
        the prefill chunk a long prompt is run in."""
        return {"max_k": self.vocab_size, "max_k_sequence": self.max_k_sequence, "context_tokens": self.context,
                "prefill_chunk_tokens": self.prefill_chunk}

    def validate(self, spec: RowSpec) -> None:
        """Raise the typed error (with ``.param``) that ``spec`` deserves, or nothing."""
        prepare_rows(self, [spec], None)

    def submit(self, spec: RowSpec) -> RowHandle:
        return self.submit_all([spec])[0]

    def submit_all(self, specs: Sequence[RowSpec], *, loop=None) -> list[RowHandle]:
        """Validate and queue every spec, or none: ServerBusyError when they do not all fit in the queue.
        ``loop``: the event loop that will read the rows' events, when this runs in a worker thread (the HTTP
        layer tokenizes off its event loop)."""
        handles = [RowHandle(next(self._ids), self._wake, loop) for _ in specs]
        rows = prepare_rows(self, specs, handles)  # each spec checked once; a prompt is tokenized once
        with self._lock:
            if not self._accepting:
                raise ServerShuttingDownError("The server is shutting down and accepts no new requests; retry on "
                                              "another instance or after it restarts.")
            if len(self._queue) + len(rows) > self.max_queue:
                retry = self._retry_after()
                raise ServerBusyError(
                    f"The server is busy: {len(self._running)} rows running and {len(self._queue)} queued (limit "
                    f"{self.max_queue}); retry in about {retry:.0f} s.", retry_after_s=retry)
            self._queue.extend(rows)
            self._lock.notify_all()
        return handles

    def stats(self) -> dict:
        with self._lock:
            return {"running": len(self._running), "queued": len(self._queue), "prefilling": len(self._prefills),
                    "steps": self._counts["steps"],
                    "tokens": self._counts["tokens"], "finished": dict(self._counts["finished"]),
                    "max_running": self.max_running, "max_queue": self.max_queue, "accepting": self._accepting,
                    "alive": self._thread is not None and self._thread.is_alive() and not self._stopped,
                    "busy_s": round(self.busy_seconds(), 3)}

    def holds_rows(self) -> bool:
        """True while a row is queued or running (and the engine was not abandoned)."""
        with self._lock:
            return not self._stopped and bool(self._queue or self._running or self._prefills)

    def busy_seconds(self) -> float:
        """Seconds since the loop last finished a step while rows wait on it (0 when idle): what ``/health``
        compares with its stall bound."""
        if not (self._running or self._queue or self._prefills):
            return 0.0
        return max(0.0, time.monotonic() - self._progress)

    def start(self) -> None:
        """Start the decode-loop thread (once)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._loop, name="steerkit-engine", daemon=True)
            self._thread.start()

    def drain(self, deadline_s: float) -> None:
        """Stop admitting and let queued and running rows finish for up to ``deadline_s`` seconds, after which the
        loop cancels the rest (FinishEvent "cancelled") and ends; returns at once. A second call can only bring
        the deadline closer."""
        with self._lock:
            self._accepting = False
            deadline = time.monotonic() + max(0.0, float(deadline_s))
            if self._drain_deadline is None or deadline < self._drain_deadline:
                self._drain_deadline = deadline
            self._lock.notify_all()

    def shutdown(self, deadline_s: float, grace_s: float = 2.0) -> None:
        """:meth:`drain`, then wait for the loop to end. A loop still inside one step ``grace_s`` after the deadline
        is abandoned: its rows get their "cancelled" FinishEvent now, and the thread (a daemon) ends with the
        process. Returns within ``deadline_s + grace_s``."""
        self.drain(deadline_s)
        with self._lock:
            if self._stopped:  # abandoned already (a second signal): nothing to wait for
                return
            thread = self._thread
            wait = max(0.0, self._drain_deadline - time.monotonic()) + grace_s
        if thread is None:  # never started: nothing runs, cancel what was queued
            with self._lock:
                queued, self._queue = list(self._queue), deque()
                self._stopped = True
            for row in queued:
                self._finish(row, "cancelled")
            return
        thread.join(wait)
        if thread.is_alive():
            self.abandon()

    def abandon(self) -> None:
        """Give every row still held its "cancelled" FinishEvent without waiting for the loop (stuck in a step);
        the loop, when it wakes, finds itself stopped and touches no row again."""
        with self._lock:
            self._stopped = True
            rows = [*self._queue, *self._prefills.rows(), *self._core.rows]
            self._queue = deque()
        for row in rows:
            if row.handle.finish is None:
                self._finish(row, "cancelled")

    # -- the loop -----------------------------------------------------------------------------------------
    def _wake(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def _loop(self) -> None:
        with new_shapes_run_eagerly():  # a shape the warm-up did not compile runs eagerly: no request waits on it
            while True:
                try:
                    if not self._iterate():
                        return
                except Exception as exc:  # noqa: BLE001 - an engine bug must not kill the loop: fail the batch
                    self._fail_all(exc)

    def _iterate(self) -> bool:
        """One pass: drop cancelled/expired rows, admit newcomers, run one step. False when the loop ends."""
        now = time.monotonic()
        with self._lock:
            if self._stopped:  # abandoned by shutdown() while inside a step: every row was finished there
                return False
            draining = self._drain_deadline is not None
            if draining and (now >= self._drain_deadline or not (self._running or self._queue or self._prefills)):
                leftovers, self._queue = [*self._queue, *self._prefills.rows()], deque()
                self._prefills.drop(leftovers)
                self._stopped = True
            else:
                leftovers = None
                expired = [r for r in [*self._queue, *self._prefills.rows()] if r.handle.cancelled or r.expired(now)]
                for row in expired:
                    if row in self._prefills:
                        self._prefills.drop([row])
                    else:
                        self._queue.remove(row)
                room = self.max_running - len(self._running) - len(self._prefills)
                admitted = self._prefills.take(self._queue, room)
                if not admitted and not self._running and not expired and not self._prefills:
                    self._progress = now
                    self._lock.wait(IDLE_WAIT_S)
                    return True
        if leftovers is not None:
            for row in leftovers:
                self._finish(row, "cancelled")
            self._remove({r: ("cancelled", None) for r in self._running})
            return False
        for row in expired:  # a row's timeout counts from submission: its queueing and prefill included
            self._finish(row, "cancelled" if row.handle.cancelled else "timeout")
        gone = {r: ("cancelled", None) if r.handle.cancelled else ("timeout", None)
                for r in self._running if r.handle.cancelled or r.expired(now)}
        if gone:
            self._remove(gone)
        if admitted or self._prefills:
            ready, failed = self._prefills.run(admitted)
            for row, exc in failed.items():
                self._finish(row, "error", exc)
            if ready:
                self._admit(list(ready), {r: p for r, p in ready.items() if p is not None})
            self._progress = time.monotonic()
        if self._running:
            start = time.perf_counter()
            self._step()
            self._progress = time.monotonic()
            self._notify("on_step", time.perf_counter() - start, len(self._running), len(self._queue))
        return True

    @property
    def _running(self) -> list[Row]:
        return self._core.rows

    def _admit(self, rows: list[Row], prefilled: dict) -> None:
        """Prefill the newcomers (together where they can share a forward; not those ``prefilled`` has run), start
        their reward sessions, and join them to the batch."""
        failed = self._core.admit(rows, prefilled=prefilled)
        for row in rows:
            if row in failed and row not in self._core.rows:
                self._finish(row, "error", failed[row])
        joined = {r: ("error", e) for r, e in failed.items() if r in self._core.rows}
        if joined:
            self._remove(joined)

    def _step(self) -> None:
        """One step of the core; events out; finished and failed rows leave; the LM reads the new tokens."""
        report = self._core.step()
        finished: dict = {}
        for e in report.emitted:
            e.row.handle._emit(TokenEvent(e.text, e.token, e.rewards))
            if e.finish is not None:
                finished[e.row] = (e.finish, None)
        self._counts["steps"] += 1
        produced = len(report.emitted) - sum(1 for e in report.emitted if e.row in report.failed)
        self._counts["tokens"] += produced
        self._notify("on_tokens", produced)
        for name, spent in report.reward_seconds.items():
            self._notify("on_reward", name, spent)
        finished.update({row: ("error", exc) for row, exc in report.failed.items()})
        if finished:
            self._remove(finished)
        if self._core.rows:
            self._core.advance()

    # -- rows leaving -------------------------------------------------------------------------------------
    def _remove(self, finished: dict) -> None:
        """Drop rows from the batch and every reward group, then send their FinishEvents: under the lock, so that
        ``stats()`` never shows a row gone from ``running`` but not yet counted as finished."""
        with self._lock:
            more = self._core.remove(finished)
            for row, (reason, exc) in finished.items():
                self._finish(row, reason, exc)
        if more:  # rows that broke while being rebuilt after a failed keep_rows
            self._remove({r: ("error", e) for r, e in more.items()})

    def _finish(self, row: Row, reason: str, error: Exception | None = None) -> None:
        if row.handle.finish is not None:  # finished already (by shutdown abandoning a stuck loop)
            return
        row.finish_reason, row.error = reason, error
        row.handle._emit(FinishEvent(reason, len(row.prompt_ids), len(row.ids), error))
        seconds = time.monotonic() - row.handle.submitted
        with self._lock:
            self._counts["finished"][reason] = self._counts["finished"].get(reason, 0) + 1
            self._row_seconds = seconds if self._row_seconds is None else 0.9 * self._row_seconds + 0.1 * seconds

    def _fail_all(self, exc: Exception) -> None:
        rows = list(self._core.rows)
        self._core.reset()
        for row in rows:
            self._finish(row, "error", exc)

    def _retry_after(self) -> float:
        """Seconds until the queue has probably moved: the rows ahead over the running slots, times the average
        time a row spends in the engine (1 s before any row finished); between 1 and 60."""
        per_row = self._row_seconds or 1.0
        waves = (len(self._queue) + len(self._running)) / self.max_running
        return float(min(60.0, max(1.0, math.ceil(per_row * max(waves, 1.0)))))

    def _notify(self, method: str, *args) -> None:
        if self.observer is None:
            return
        try:
            getattr(self.observer, method)(*args)
        except Exception:  # noqa: BLE001 - metrics must never break decoding
            pass


def _reward_name(reward, lookup: RewardLookup) -> str:
    for name, known in lookup.rewards.items():
        if known is reward:
            return name
    return getattr(reward, "name", "reward")
