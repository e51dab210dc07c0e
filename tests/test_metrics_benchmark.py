"""benchmarks/collector.py keeps working (a few runs; the real numbers come from the script)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "collector.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pt_collector_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_collector_benchmark_smoke() -> None:
    bench = _load()
    large = bench.bench_large(3, 1, interrupts=False)
    assert large["cpus_with_rates"] == 256 and large["unavailable"] == {}
    assert "interrupts" not in large["families"]            # opt-in, never in the default sample
    sr = large["sample_and_rates"]
    assert 0 < sr["cpu_us_median"] <= sr["cpu_us_p90"] and sr["cpu_pct_at_1s"] > 0
    real = bench.bench_real(3, 1)
    assert "stat" in real["families"] and real["sample_and_rates"]["wall_us_median"] > 0
