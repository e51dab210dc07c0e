"""draw_report: the three views render from bench rows; Pareto front; input checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from polltuned.errors import UsageError
from polltuned.records import Window
from polltuned.report import draw_report, pareto_front, to_points


def test_pareto_front() -> None:
    pts = [(0.2, 3000.0), (0.5, 15.0), (0.4, 30.0), (0.45, 12.0), (0.9, 11.0), (0.3, 5000.0), (0.6, 40.0)]
    assert pareto_front(pts) == [(0.2, 3000.0), (0.4, 30.0), (0.45, 12.0), (0.9, 11.0)]


def test_to_points_shapes() -> None:
    w = Window(ok=True, latency={"p99": 100.0}, cpu_cores=0.5).to_json()
    bad = Window.failed("boom").to_json()
    pts = to_points([
        {"config": {"a": 1}, "objective": 120.0, "window": w, "phase": "tune"},
        {"config": {"a": 2}, "objective": None, "window": bad},
        {"config": {"a": 3}, "objective": 9.0, "p99_us": 8.0, "cpu_cores": 1.0},
    ])
    assert (pts[0].latency_us, pts[0].cpu_cores, pts[0].phase) == (100.0, 0.5, "tune")
    assert pts[1].objective is None and pts[1].latency_us is None
    assert pts[2].latency_us == 8.0
    with pytest.raises(UsageError, match="no 'config'"):
        to_points([{"objective": 1.0}])


def test_draw_report_png(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = []
    for i in range(12):
        br = [0, 50, 100, 0, 25][i % 5]
        lat = 150.0 if br == 0 else 12.0 + i
        w = Window(ok=i != 7, latency={"p99": lat} if i != 7 else {}, cpu_cores=0.2 if br == 0 else 0.9,
                   error=None if i != 7 else "x")
        rows.append({"config": {"net.core.busy_read": br, "kernel.timer_migration": i % 2, "fixed": 1},
                     "objective": None if i == 7 else lat * (1 + 0.5 * (w.cpu_cores or 0)),
                     "window": w.to_json(), "phase": "tune" if i < 9 else "compare"})
    out = draw_report(rows, tmp_path / "r.png", title="t")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    with pytest.raises(UsageError, match="no trials"):
        draw_report([], tmp_path / "e.png")
