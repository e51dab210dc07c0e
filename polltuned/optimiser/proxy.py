"""The daemon's optimiser: the scikit-optimize GP behind a pipe, in a model worker process.

:class:`WorkerOptimiser` implements the Optimiser and Predicting protocols (polltuned.optimiser.base)
by forwarding every call to a model worker (polltuned.optimiser.worker, spawned by the injected
``spawn``: polltuned.host.modelproc in the daemon), so the daemon's own process never imports
scikit-optimize, scikit-learn, scipy or numpy (issue 14: the model alone is ~110 MB resident).

What the proxy keeps is enough to rebuild the worker at any time: the constructor arguments and the
optimiser's state after the last call (the worker's second reply line, kept as text, never parsed
here; SkoptOptimiser.state). So the worker may exit whenever it has been idle (``--idle-s``; in HOLD
it lives only around a challenger or a region's search) and its successor, started at the next
call, answers exactly what the first would have: the same calls give the same answers as the
in-process SkoptOptimiser (tests/test_model_worker.py).

Failures are typed (polltuned.errors): a worker that had exited before it answered is started again
from the kept state and asked once more; one that dies twice, does not answer within ``timeout_s``,
or answers garbage is a ModelWorkerError (the worker is killed; the next call starts a fresh one).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from polltuned.errors import ModelWorkerError, ModelWorkerGone
from polltuned.optimiser.base import Context, Recommendation
from polltuned.optimiser.space import Space
from polltuned.optimiser.worker import space_to_json
from polltuned.records import KnobValue


class Channel(Protocol):
    """One worker process: a line out, a line back (polltuned.host.modelproc.PipeProcess)."""

    @property
    def pid(self) -> int: ...
    def alive(self) -> bool: ...
    def write_line(self, line: str) -> None: ...
    def readline(self, timeout_s: float) -> str: ...
    def close(self, grace_s: float = 2.0) -> int | None: ...


class WorkerOptimiser:
    """SkoptOptimiser's protocol, answered by a model worker process (see the module docstring)."""

    name = "skopt-worker"

    def __init__(self, space: Space, baseline: Mapping[str, KnobValue], *, seed: int, initial_points: int = 6,
                 safety_limit: float | None = None, spawn: Callable[[], Channel], timeout_s: float = 120.0) -> None:
        self.space = space
        self._init: dict[str, Any] = {"space": space_to_json(space), "baseline": dict(baseline), "seed": int(seed),
                                      "initial_points": int(initial_points), "safety_limit": safety_limit}
        self._spawn = spawn
        self.timeout_s = timeout_s
        self._proc: Channel | None = None
        self._state: str | None = None
        self._cpu = 0.0
        #: workers started so far (the first one included)
        self.spawns = 0

    # ------------------------------------------------------------------ the pipe
    def _start(self) -> Channel:
        if self._proc is not None:
            if self._proc.alive():
                return self._proc
            self._proc.close(0.5)
            self._proc = None
        p = self._spawn()
        self.spawns += 1
        self._proc = p
        init = json.dumps(self._init)
        req = '{"op": "init", "args": ' + (init[:-1] + ', "state": ' + self._state + "}"
                                           if self._state is not None else init) + "}"
        try:
            self._exchange(p, "init", req)
        except ModelWorkerError:
            self._drop()
            raise
        return p

    def _exchange(self, p: Channel, op: str, req: str) -> Any:
        p.write_line(req)
        head = p.readline(self.timeout_s)
        try:
            doc = json.loads(head)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("ok"), bool):
            raise ModelWorkerError(f"model worker: garbage in reply to {op}: {head[:120]!r}")
        if not doc["ok"]:
            raise ModelWorkerError(f"model worker: {op} failed: {doc.get('error')}")
        state = p.readline(self.timeout_s)
        if not (state.startswith("{") and state.endswith("}")):
            raise ModelWorkerError(f"model worker: garbage state after {op}: {state[:120]!r}")
        self._state = state
        cpu = doc.get("cpu")
        if isinstance(cpu, (int, float)):
            self._cpu = float(cpu)
        return doc.get("result")

    def _drop(self) -> None:
        p, self._proc = self._proc, None
        if p is not None:
            p.close(0.5)

    def _call(self, op: str, **args: Any) -> Any:
        req = json.dumps({"op": op, "args": args})
        for attempt in (1, 2):
            try:
                return self._exchange(self._start(), op, req)
            except ModelWorkerGone:
                self._drop()
                if attempt == 2:
                    raise
            except ModelWorkerError:
                self._drop()
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Stop the worker now (the next call starts another from the kept state)."""
        self._drop()

    @property
    def worker_pid(self) -> int | None:
        """The running worker's pid (None when there is none right now)."""
        return self._proc.pid if self._proc is not None and self._proc.alive() else None

    # ------------------------------------------------------------------ the Optimiser protocol
    def ask(self, remaining: int | None = None, pending: Sequence[Mapping[str, KnobValue]] = (), *,
            context: Context | None = None) -> dict[str, KnobValue]:
        return _config(self._call("ask", remaining=remaining, pending=[dict(p) for p in pending],
                                  context=_ctx(context)))

    def tell(self, config: Mapping[str, KnobValue], y: float, *, context: Context | None = None) -> None:
        self._call("tell", config=dict(config), y=float(y), context=_ctx(context))

    def retell(self, observations: Sequence[tuple[Mapping[str, KnobValue], float]], *,
               contexts: Sequence[Context | None] | None = None) -> None:
        self._call("retell", observations=[[dict(c), float(y)] for c, y in observations],
                   contexts=None if contexts is None else [_ctx(c) for c in contexts])

    def tell_failed(self, config: Mapping[str, KnobValue]) -> None:
        self._call("tell_failed", config=dict(config))

    def set_noise(self, sd: float) -> None:
        self._call("set_noise", sd=float(sd))

    def best(self, *, context: Context | None = None) -> Recommendation | None:
        return _rec(self._call("best", context=_ctx(context)))

    def candidate(self, *, context: Context | None = None) -> Recommendation | None:
        return _rec(self._call("candidate", context=_ctx(context)))

    def simplify(self, config: Mapping[str, KnobValue], *, context: Context | None = None) -> dict[str, KnobValue]:
        return _config(self._call("simplify", config=dict(config), context=_ctx(context)))

    def predict(self, configs: Sequence[Mapping[str, KnobValue]], *,
                context: Context | None = None,
                against: Mapping[str, KnobValue] | None = None) -> list[tuple[float, float]]:
        out = self._call("predict", configs=[dict(c) for c in configs], context=_ctx(context),
                         against=None if against is None else dict(against))
        if not isinstance(out, list) or len(out) != len(configs):
            raise ModelWorkerError(f"model worker: predict answered {str(out)[:120]!r} for {len(configs)} configs")
        try:
            return [(float(m), float(s)) for m, s in out]
        except (TypeError, ValueError) as e:
            raise ModelWorkerError(f"model worker: predict answered garbage: {e}") from e

    @property
    def cpu_seconds(self) -> float:
        """The model's CPU seconds inside its calls (as SkoptOptimiser counts them), as of the last reply."""
        return self._cpu


def _ctx(context: Context | None) -> dict[str, float] | None:
    return None if context is None else {str(k): float(v) for k, v in context.items()}


def _config(x: Any) -> dict[str, KnobValue]:
    if not isinstance(x, dict) or not all(isinstance(v, (int, float, str)) and not isinstance(v, bool)
                                          for v in x.values()):
        raise ModelWorkerError(f"model worker: expected a configuration, got {str(x)[:120]!r}")
    return dict(x)


def _rec(x: Any) -> Recommendation | None:
    if x is None:
        return None
    try:
        return Recommendation(_config(x["config"]), float(x["predicted"]), float(x["observed_mean"]),
                              int(x["windows"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ModelWorkerError(f"model worker: expected a recommendation, got {str(x)[:120]!r}") from e
