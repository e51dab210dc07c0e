"""prometheus probe: histogram parsing, diff, quantile interpolation, and a real local endpoint."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from polltuned.clock import FakeClock
from polltuned.errors import ProbeError
from polltuned.policy.schema import PrometheusProbe as Cfg
from polltuned.probes.prometheus import (
    PrometheusProbe,
    diff_histograms,
    histogram_quantile,
    parse_histogram,
)


def page(counts: tuple[int, int, int, int], total_sum: float, other: int = 0) -> str:
    c1, c2, c3, cinf = counts
    return f"""# HELP rpc_seconds RPC latency
# TYPE rpc_seconds histogram
rpc_seconds_bucket{{method="get",le="0.0001"}} {c1}
rpc_seconds_bucket{{method="get",le="0.0005"}} {c2}
rpc_seconds_bucket{{method="get",le="0.001"}} {c3}
rpc_seconds_bucket{{method="get",le="+Inf"}} {cinf}
rpc_seconds_sum{{method="get"}} {total_sum}
rpc_seconds_count{{method="get"}} {cinf}
rpc_seconds_bucket{{method="put",le="0.0001"}} {other}
rpc_seconds_bucket{{method="put",le="0.0005"}} {other}
rpc_seconds_bucket{{method="put",le="0.001"}} {other}
rpc_seconds_bucket{{method="put",le="+Inf"}} {other}
rpc_seconds_sum{{method="put"}} 0
rpc_seconds_count{{method="put"}} {other}
"""


def test_histogram_quantile_like_promql() -> None:
    b = ((1.0, 10.0), (2.0, 20.0), (4.0, 40.0), (math.inf, 40.0))
    assert histogram_quantile(0.5, b) == pytest.approx(2.0)      # rank 20 -> top of bucket (1,2]
    assert histogram_quantile(0.25, b) == pytest.approx(1.0)
    assert histogram_quantile(0.75, b) == pytest.approx(3.0)     # rank 30 halfway in (2,4]
    assert histogram_quantile(0.1, b) == pytest.approx(0.4)      # first bucket interpolates from 0
    tail = ((1.0, 10.0), (math.inf, 20.0))
    assert histogram_quantile(0.99, tail) == 1.0                # +Inf bucket -> last finite bound
    assert math.isnan(histogram_quantile(0.5, ((1.0, 0.0), (math.inf, 0.0))))


def test_parse_diff_and_labels() -> None:
    a = parse_histogram(page((10, 50, 90, 100), 0.03), "rpc_seconds", {"method": "get"})
    b = parse_histogram(page((20, 150, 190, 200), 0.06), "rpc_seconds", {"method": "get"})
    d = diff_histograms(a, b)
    assert d.total == 100 and d.buckets[1] == (0.0005, 100.0)
    both = parse_histogram(page((10, 50, 90, 100), 0.03, other=5), "rpc_seconds", {})
    assert both.total == 105  # summed over series, like sum by (le)
    with pytest.raises(ProbeError, match="counter reset"):
        diff_histograms(b, a)
    with pytest.raises(ProbeError, match="no histogram"):
        parse_histogram(page((1, 1, 1, 1), 0.0), "nope_seconds", {})


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    pages: list[str] = []

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (pages.pop(0) if pages else "").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics", pages
    finally:
        srv.shutdown()
        srv.server_close()


def test_probe_against_local_endpoint(server: tuple[str, list[str]]) -> None:
    url, pages = server
    pages += [page((10, 50, 90, 100), 0.03), page((20, 150, 190, 200), 0.06)]
    cfg = Cfg(url=url, metric="rpc_seconds", labels={"method": "get"})
    clock = FakeClock()
    w = PrometheusProbe(cfg, clock=clock).measure(5.0, 0)
    assert w.ok, w.error
    assert clock.slept == [5.0]
    assert w.observations == 100
    # diff buckets: 10 in (0,100us], the other 90 in (100,500us]: p50 rank 50 -> 100 + 400*(40/90) us
    assert w.latency["p50"] == pytest.approx(100 + 400 * 40 / 90)
    assert w.latency["p99"] == pytest.approx(100 + 400 * 89 / 90)
    assert w.latency["mean"] == pytest.approx(300.0)


def test_probe_reset_and_unreachable(server: tuple[str, list[str]], caplog: pytest.LogCaptureFixture) -> None:
    url, pages = server
    pages += [page((20, 150, 190, 200), 0.06), page((1, 2, 3, 4), 0.001)]
    with caplog.at_level("WARNING", logger="polltuned.probes"):
        w = PrometheusProbe(Cfg(url=url, metric="rpc_seconds"), clock=FakeClock()).measure(1.0, 2)
        assert not w.ok and "counter reset" in (w.error or "")
        dead = PrometheusProbe(Cfg(url="http://127.0.0.1:1/metrics", metric="rpc_seconds", timeout_s=1),
                               clock=FakeClock()).measure(1.0, 3)
    assert not dead.ok and "cannot scrape" in (dead.error or "")
    assert sum("probe prometheus window" in r.getMessage() for r in caplog.records) == 2
