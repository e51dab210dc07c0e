"""On the real kernel: the context chosen for the model stays put when only the knobs change and
moves when the load changes (the bench's netns + veth + sockperf world; root; holds the lock).

Two bench layouts (polltuned.bench.world): ``single`` (one session, client CPU0, server CPU1)
and ``parallel`` (four sessions to one server on CPU0, clients alternating CPU0/CPU1); in each,
windows alternate busy_read = busy_poll = 0 and 50 (A B A B). Stated tolerance: ``flows`` and
``runnable_others`` are identical between the knob settings of one layout (they are counts; a
busy peer stays busy); the secondary NET_RX rate, printed for comparison, is not (busy polling
moves it). Every knob and namespace is back afterwards.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from polltuned.bench.session import BenchSettings, bench_session
from polltuned.clock import SystemClock
from polltuned.host.fs import FsHost

GLOBAL_KNOBS = ("/proc/sys/net/core/busy_read", "/proc/sys/net/core/busy_poll",
                "/proc/sys/net/core/gro_normal_batch", "/proc/sys/kernel/timer_migration")


def _snapshot(host: FsHost) -> dict[str, str]:
    snap = {p: host.read_text(p).strip() for p in GLOBAL_KNOBS if host.exists(p)}
    snap["netns"] = ",".join(n for n in host.glob("/run/netns", "*") if not n.startswith("ptb-"))
    return snap


def _contexts(workload: str, state: Path) -> dict[int, list[dict[str, float]]]:
    """busy value -> the contexts of its windows (A B A B over busy 0 / 50)."""
    host = FsHost("/")
    out: dict[int, list[dict[str, float]]] = {0: [], 50: []}
    settings = BenchSettings(workload=workload, window_s=1.0, state_dir=state)
    with bench_session(settings, host=host, clock=SystemClock()) as sess:
        base = sess.env.current()
        i = 0
        for _ in range(2):
            for busy in (0, 50):
                sess.env.apply({**base, "net.core.busy_read": busy, "net.core.busy_poll": busy})
                w = sess.env.measure(i)
                i += 1
                assert w.ok, w.error
                out[busy].append({**w.context, "net_rx_per_s (secondary)": w.extra.get("context2.net_rx_per_s",
                                                                                      float("nan"))})
    assert sess.restored
    return out


@pytest.mark.realkernel
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_context_stays_with_the_knobs_and_moves_with_the_load(real_kernel: None, tmp_path: Path) -> None:
    for tool in ("sockperf", "ethtool", "ip"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    host = FsHost("/")
    before = _snapshot(host)
    single = _contexts("single", tmp_path / "s1")
    parallel = _contexts("parallel", tmp_path / "s2")
    assert _snapshot(host) == before, "a knob or namespace was not restored"
    print("single", single)
    print("parallel", parallel)
    for name, got in (("single", single), ("parallel", parallel)):
        for key in ("flows", "runnable_others"):
            vals = {busy: {c[key] for c in cs} for busy, cs in got.items()}
            assert vals[0] == vals[50], f"{name}: {key} moved with the knobs: {vals}"
            assert len(vals[0]) == 1, f"{name}: {key} not steady at fixed knobs: {vals}"
        assert "offered_rate" not in got[0][0], "ping-pong is closed-loop: its rate follows the RTT"
    assert single[0][0]["flows"] == 1.0 and parallel[0][0]["flows"] == 4.0
    # single: nothing else runs on the server's CPU1; parallel: two of the four clients share CPU0
    assert single[0][0]["runnable_others"] == 0.0
    assert parallel[0][0]["runnable_others"] >= 1.0
