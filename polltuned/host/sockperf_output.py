"""sockperf's client output, parsed: pure functions of its text (3.x, ``--full-rtt``; the
``--full-log`` samples), and the merge of several sessions' statistics. Here, beside the programs
that run sockperf (the sockperf probe, polltuned.probes.sockperf, and the mix client,
polltuned.host.mixclient), so that both use it without host/ importing a layer above it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from polltuned.errors import ProbeError
from polltuned.histogram import LatencyHistogram

_ANSI = re.compile(r"\x1b\[[0-9;]*m|\[[0-9;]*m")
# sockperf 3.x client summary (src/client.cpp, print_average_results / print_log_percentile):
#   sockperf: [Valid Duration] RunTime=0.550 sec; SentMessages=9317; ReceivedMessages=9317
#   sockperf: ====> avg-rtt=59.037 (std-dev=15.655)           (avg-latency=... without --full-rtt)
#   sockperf: # dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0
#   sockperf: Summary: Round trip is 59.037 usec               ("Latency is" without --full-rtt)
#   sockperf: Total 9317 observations; each percentile contains 93.17 observations
#   sockperf: ---> <MAX> observation =  996.578
#   sockperf: ---> percentile 99.999 =  996.578   ... down to 25.000
#   sockperf: ---> <MIN> observation =   21.281
_VALID = re.compile(
    r"\[Valid Duration\]\s*RunTime=([\d.]+)\s*sec;\s*SentMessages=(\d+);\s*ReceivedMessages=(\d+)"
)
_AVG = re.compile(r"avg-(?:rtt|latency)=([\d.]+)\s*\(std-dev=([\d.]+)\)")
_DROPPED = re.compile(r"#\s*dropped messages\s*=\s*(\d+)")
_SUMMARY = re.compile(r"Summary:\s*(?:Round trip|Latency) is\s*([\d.]+)\s*usec")
_TOTAL = re.compile(r"Total\s+(\d+)\s+observations")
_PCT = re.compile(r"--->\s*percentile\s+([\d.]+)\s*=\s*([\d.]+)")
_MAX = re.compile(r"--->\s*<MAX> observation\s*=\s*([\d.]+)")
_MIN = re.compile(r"--->\s*<MIN> observation\s*=\s*([\d.]+)")
_NO_REPLY = "No messages were received from the server"
# --full-log (src/client.cpp, print_log): a header, then "seq, txTime, rxTime, rtt" per valid sample
_FULL_LOG_HEADER = "packet, txTime(sec), rxTime(sec), rtt(usec)"


@dataclass(frozen=True)
class SockperfResult:
    """One sockperf client run. Latencies in µs (round trip with --full-rtt)."""

    mean_us: float
    stddev_us: float
    observations: int
    runtime_s: float
    sent: int
    received: int
    dropped: int
    max_us: float
    min_us: float
    percentiles: dict[float, float] = field(default_factory=dict)

    @property
    def msg_rate(self) -> float:
        return self.received / self.runtime_s if self.runtime_s > 0 else 0.0

    def pct(self, q: float) -> float:
        """The reported percentile ``q`` (e.g. 99.0); the nearest reported one above if absent."""
        if q in self.percentiles:
            return self.percentiles[q]
        above = sorted(k for k in self.percentiles if k >= q)
        if above:
            return self.percentiles[above[0]]
        return self.max_us


def parse_sockperf(text: str) -> SockperfResult:
    """Parse a sockperf client's stdout+stderr. Raises ProbeError naming what is missing."""
    clean = _ANSI.sub("", text)
    if _NO_REPLY in clean:
        raise ProbeError("sockperf: no messages were received from the server (is the server down?)")
    m_valid = _VALID.search(clean)
    m_avg = _AVG.search(clean)
    m_total = _TOTAL.search(clean)
    m_max = _MAX.search(clean)
    m_min = _MIN.search(clean)
    pcts = {float(q): float(v) for q, v in _PCT.findall(clean)}
    missing = [
        name
        for name, m in (("[Valid Duration]", m_valid), ("avg-rtt", m_avg), ("Total N observations", m_total),
                        ("<MAX> observation", m_max), ("<MIN> observation", m_min))
        if m is None
    ]
    if not pcts:
        missing.append("percentile lines (run with --full-rtt)")
    if missing:
        last = (clean.strip().splitlines() or ["<no output>"])[-1]
        raise ProbeError(f"sockperf output lacks {', '.join(missing)}; last line: {last.strip()!r}")
    assert m_valid and m_avg and m_total and m_max and m_min
    mean = float(m_avg.group(1))
    m_sum = _SUMMARY.search(clean)
    if m_sum is not None:
        mean = float(m_sum.group(1))
    m_drop = _DROPPED.search(clean)
    return SockperfResult(
        mean_us=mean,
        stddev_us=float(m_avg.group(2)),
        observations=int(m_total.group(1)),
        runtime_s=float(m_valid.group(1)),
        sent=int(m_valid.group(2)),
        received=int(m_valid.group(3)),
        dropped=int(m_drop.group(1)) if m_drop else 0,
        max_us=float(m_max.group(1)),
        min_us=float(m_min.group(1)),
        percentiles=pcts,
    )


def parse_full_log(text: str) -> list[int]:
    """Pure: the per-sample round trips (ns) sockperf ``--full-log`` printed after its header line
    (``packet, txTime(sec), rxTime(sec), rtt(usec)``). Raises ProbeError when there is no such log."""
    clean = _ANSI.sub("", text)
    at = clean.find(_FULL_LOG_HEADER)
    if at < 0:
        raise ProbeError("sockperf output has no per-sample log (--full-log)")
    out: list[int] = []
    for line in clean[at + len(_FULL_LOG_HEADER):].splitlines():
        parts = line.split(",")
        if len(parts) != 4:
            continue  # the closing ----- line, blank lines
        try:
            out.append(round(float(parts[3]) * 1e3))
        except ValueError:
            continue
    if not out:
        raise ProbeError("sockperf per-sample log is empty")
    return out


def samples_histogram(per_session: Sequence[Sequence[int]]) -> str:
    """Pure: the encoded histogram of every session's samples (ns) together."""
    h = LatencyHistogram()
    for samples in per_session:
        for v in samples:
            h.record_ns(v)
    return h.encode()


def merge_results(results: Sequence[SockperfResult]) -> SockperfResult:
    """Merge parallel sessions.

    sockperf prints percentiles, not histograms, so the union's percentiles are approximated by the
    observation-weighted mean of each session's percentile (exact when sessions are alike); max/min
    are exact, rates add up.
    """
    if not results:
        raise ValueError("merge_results needs at least one result")
    if len(results) == 1:
        return results[0]
    n = sum(r.observations for r in results) or 1
    keys = set(results[0].percentiles)
    for r in results[1:]:
        keys &= set(r.percentiles)
    pcts = {q: sum(r.percentiles[q] * r.observations for r in results) / n for q in keys}
    runtime = max(r.runtime_s for r in results)
    return SockperfResult(
        mean_us=sum(r.mean_us * r.observations for r in results) / n,
        stddev_us=max(r.stddev_us for r in results),
        observations=sum(r.observations for r in results),
        runtime_s=runtime,
        # scale counts so that msg_rate is the sum of the per-session rates
        sent=sum(r.sent for r in results),
        received=round(sum(r.msg_rate for r in results) * runtime),
        dropped=sum(r.dropped for r in results),
        max_us=max(r.max_us for r in results),
        min_us=min(r.min_us for r in results),
        percentiles=pcts,
    )
