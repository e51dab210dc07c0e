"""The model worker: the scikit-optimize GP in a process of its own (``python -m polltuned.optimiser.worker``).

The daemon keeps scikit-optimize, scikit-learn, scipy and numpy (~110 MB resident) out of its own
process: its optimiser is a :class:`polltuned.optimiser.proxy.WorkerOptimiser` that forwards every
call over a pipe to this worker, which owns a :class:`~polltuned.optimiser.skopt_backend.SkoptOptimiser`.

Protocol (one JSON document per line, both ways; floats round-trip exactly):

* request ``{"op": NAME, "args": {...}}``; the first request of a worker is ``init`` (the
  optimiser's constructor arguments, the space's dimensions, and optionally the ``state`` of a
  previous worker to take over);
* reply ``{"ok": true, "result": ..., "cpu": SECONDS}`` then, on a second line, the optimiser's whole state
  (SkoptOptimiser.state) after the call — the proxy keeps that line as it is (it never parses it)
  and hands it to the next worker, so a worker may exit at any time between calls and its
  successor answers exactly as it would have; or ``{"ok": false, "error": "..."}`` (one line).

The worker exits on end of input, on ``{"op": "exit"}``, or after ``--idle-s`` seconds without a
request (the proxy starts another when the engine next asks). It writes nothing else to stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import select
import sys
from collections.abc import Mapping
from typing import IO, Any

from polltuned.optimiser.base import Recommendation
from polltuned.optimiser.space import Dim, Space
from polltuned.records import KnobValue


def space_to_json(space: Space) -> dict[str, Any]:
    """Pure: the space as JSON data (its dimensions' fields; tuples as lists)."""
    return {"width": space.width,
            "dims": [{"key": d.key, "kind": d.kind, "is_int": d.is_int, "lo": d.lo, "hi": d.hi, "log": d.log,
                      "choices": list(d.choices), "seeds": list(d.seeds), "requires": list(d.requires),
                      "off_value": d.off_value, "offset": d.offset} for d in space.dims]}


def space_from_json(doc: Mapping[str, Any]) -> Space:
    """Pure: the inverse of :func:`space_to_json`."""
    dims = tuple(Dim(key=str(d["key"]), kind=str(d["kind"]), is_int=bool(d["is_int"]), lo=float(d["lo"]),
                     hi=float(d["hi"]), log=bool(d["log"]), choices=tuple(d["choices"]), seeds=tuple(d["seeds"]),
                     requires=tuple(str(r) for r in d["requires"]), off_value=d["off_value"], offset=int(d["offset"]))
                 for d in doc["dims"])
    return Space(dims, int(doc["width"]))


def rec_to_json(rec: Recommendation | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {"config": rec.config, "predicted": rec.predicted, "observed_mean": rec.observed_mean,
            "windows": rec.windows}


def _cfg(x: Any) -> dict[str, KnobValue]:
    if not isinstance(x, dict):
        raise ValueError(f"a configuration must be an object (got {type(x).__name__})")
    return dict(x)


class Worker:
    """Dispatches requests to one SkoptOptimiser (built by ``init``)."""

    def __init__(self) -> None:
        self.opt: Any = None

    def handle(self, op: str, a: Mapping[str, Any]) -> Any:
        if op == "init":
            from polltuned.optimiser.skopt_backend import SkoptOptimiser  # lazy: scikit-optimize is heavy

            self.opt = SkoptOptimiser(space_from_json(a["space"]), _cfg(a["baseline"]), seed=int(a["seed"]),
                                      initial_points=int(a["initial_points"]), safety_limit=a["safety_limit"])
            if a.get("state") is not None:
                self.opt.restore(a["state"])
            return None
        o = self.opt
        if o is None:
            raise ValueError(f"{op!r} before init")
        if op == "ask":
            return o.ask(a.get("remaining"), [_cfg(p) for p in a.get("pending", [])], context=a.get("context"))
        if op == "tell":
            return o.tell(_cfg(a["config"]), float(a["y"]), context=a.get("context"))
        if op == "retell":
            return o.retell([(_cfg(c), float(y)) for c, y in a["observations"]], contexts=a.get("contexts"))
        if op == "tell_failed":
            return o.tell_failed(_cfg(a["config"]))
        if op == "set_noise":
            return o.set_noise(float(a["sd"]))
        if op == "best":
            return rec_to_json(o.best(context=a.get("context")))
        if op == "candidate":
            return rec_to_json(o.candidate(context=a.get("context")))
        if op == "simplify":
            return o.simplify(_cfg(a["config"]), context=a.get("context"))
        if op == "predict":
            vs = a.get("against")
            return [list(p) for p in o.predict([_cfg(c) for c in a["configs"]], context=a.get("context"),
                                               against=None if vs is None else _cfg(vs))]
        if op == "cpu":
            return o.cpu_seconds
        raise ValueError(f"unknown request {op!r}")


def serve(inp: IO[str], out: IO[str], *, idle_s: float | None) -> int:
    """Answer requests from ``inp`` until end of input, ``exit`` or ``idle_s`` without one."""
    w = Worker()
    while True:
        if idle_s is not None and not select.select([inp], [], [], idle_s)[0]:
            return 0
        line = inp.readline()
        if not line:
            return 0
        try:
            req = json.loads(line)
            op = str(req["op"])
            if op == "exit":
                return 0
            result = w.handle(op, req.get("args") or {})
            reply = json.dumps({"ok": True, "result": result, "cpu": w.opt.cpu_seconds})
            state = json.dumps(w.opt.state())
        except Exception as e:
            out.write(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}) + "\n")
            out.flush()
            continue
        out.write(reply + "\n" + state + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m polltuned.optimiser.worker", description=__doc__.splitlines()[0])
    p.add_argument("--idle-s", type=float, default=None, help="exit after this many seconds without a request")
    args = p.parse_args(argv)
    idle = args.idle_s if args.idle_s is not None and math.isfinite(args.idle_s) and args.idle_s > 0 else None
    return serve(sys.stdin, sys.stdout, idle_s=idle)


if __name__ == "__main__":
    raise SystemExit(main())
