"""Load a benchmark script (benchmarks/NAME.py, not a package) as a module, once per process.

The scripts import one another (``decisions`` and ``resolvability`` use ``tuner_quality``'s runs and
optima, ``fleet`` uses ``tuner_quality`` and ``pgcluster``) and the tests import them; all of them go
through :func:`load`, so each script is executed once and shared under the name ``pt_NAME``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def load(name: str) -> ModuleType:
    key = f"pt_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod          # registered first: dataclasses and pickling look it up by name
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[key]
        raise
    return mod
