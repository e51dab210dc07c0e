"""vhost-net on a KVM host: worker thread affinity (``vhost:affinity``) and the QEMU ``poll-us``
recommendation.

The vhost busy-loop timeout (``VHOST_SET_VRING_BUSYLOOP_TIMEOUT``) is accepted only from the
process owning the vhost device (QEMU's ``-netdev tap,...,poll-us=N``, set at netdev creation,
no QMP command): it is *not* a host knob (knobs.md 3.8.1). What a host daemon can change is the
CPU affinity of the ``vhost-<qemu pid>`` worker threads (6.4+: threads of QEMU, no
PF_NO_SETAFFINITY), exposed here as a strategy like IRQ affinity.
"""

from __future__ import annotations

from dataclasses import dataclass

from polltuned.errors import HostError, KnobValueError
from polltuned.host.cpus import format_cpu_list, get_thread_affinity, online_cpus, parse_cpu_list, set_thread_affinity
from polltuned.host.fs import Host
from polltuned.knobs.base import Availability, JsonValue, Knob, KnobGone, choice_domain
from polltuned.knobs.irq import parse_affinity_map
from polltuned.records import KnobValue

VHOST_AFFINITY_KEY = "vhost:affinity"
VHOST_STRATEGIES = ("kernel-default", "pack-app", "avoid-app")
VMM_OWNED_NOTE = "vhost busy-loop timeout: owned by the VMM (QEMU -netdev tap,poll-us=N); not a host knob"


@dataclass(frozen=True)
class PollUsRecommendation:
    poll_us: int
    reason: str

    def render(self) -> str:
        return (f"recommended QEMU vhost busy-loop: -netdev tap,...,vhost=on,poll-us={self.poll_us} "
                f"({self.reason}; set by the VMM at netdev creation, not by polltuned)")


def recommend_vhost_poll_us(busy_poll_us: int | None, sessions: int | None = None,
                            cpu_headroom_cores: float | None = None) -> PollUsRecommendation:
    """What to put in QEMU's ``poll-us`` given the tuned host busy-poll budget.

    Heuristic from the seeds (vhost spinning helps with many sessions, hurts with few): mirror the
    best ``net.core.busy_poll`` found (clamped to 0..100 µs); 0 when fewer than 16 sessions or less
    than one spare core, since a spinning vhost worker then only steals CPU from the guests.
    """
    if busy_poll_us is None or busy_poll_us <= 0:
        return PollUsRecommendation(0, "busy polling did not pay off on this host")
    if sessions is not None and sessions < 16:
        return PollUsRecommendation(0, f"only {sessions} sessions: vhost spinning hurts at low concurrency")
    if cpu_headroom_cores is not None and cpu_headroom_cores < 1.0:
        return PollUsRecommendation(0, f"{cpu_headroom_cores:.2f} spare cores: no room for a spinning worker")
    v = min(int(busy_poll_us), 100)
    return PollUsRecommendation(v, f"mirrors tuned net.core.busy_poll={busy_poll_us} µs (capped at 100)")


def parse_comm(text: str) -> str:
    """/proc/PID/task/TID/comm: the thread name followed by a newline."""
    return text.rstrip("\n")


def vhost_threads(host: Host) -> list[int]:
    """TIDs of threads named ``vhost-*`` (QEMU vhost workers, or kthreads before 6.4)."""
    out: list[int] = []
    for pid in host.glob("/proc", "[0-9]*"):
        for tid in host.glob(f"/proc/{pid}/task", "[0-9]*"):
            try:
                if parse_comm(host.read_text(f"/proc/{pid}/task/{tid}/comm")).startswith("vhost-"):
                    out.append(int(tid))
            except HostError:
                continue
    return sorted(set(out))


class VhostAffinityKnob(Knob):
    kind = "vhost-affinity"

    def __init__(self, host: Host, app_cpus: tuple[int, ...] | list[int]) -> None:
        self.host = host
        self.app = sorted(set(app_cpus))
        self.key = VHOST_AFFINITY_KEY
        self.domain = choice_domain(VHOST_STRATEGIES, "CPU affinity of vhost-* worker threads")

    def availability(self) -> Availability:
        if not vhost_threads(self.host):
            return Availability(False, False, "no vhost workers (no vhost-* threads: not a KVM/vhost-net host)")
        return Availability(True, True)

    def _current(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for tid in vhost_threads(self.host):
            try:
                out[str(tid)] = format_cpu_list(get_thread_affinity(self.host, tid))
            except HostError:
                continue
        return out

    def read(self) -> KnobValue:
        cur = self._current()
        if not cur:
            raise KnobGone(f"{self.key}: no vhost workers")
        return ";".join(f"{k}:{v}" for k, v in sorted(cur.items(), key=lambda kv: int(kv[0])))

    def snapshot(self) -> JsonValue:
        cur: dict[str, JsonValue] = dict(self._current())
        return cur

    def validate(self, value: object) -> KnobValue:
        if isinstance(value, str) and value not in VHOST_STRATEGIES and parse_affinity_map(value) is not None:
            return value  # an explicit placement as read() returns it
        v = super().validate(value)
        if v in ("pack-app", "avoid-app") and not self.app:
            raise KnobValueError(f"{self.key}: {v!r} needs app_cpus")
        return v

    def write(self, value: KnobValue, *, baseline: JsonValue = None) -> None:
        online = online_cpus(self.host)
        explicit = parse_affinity_map(str(value)) if value not in VHOST_STRATEGIES else None
        if explicit is not None:
            live = set(vhost_threads(self.host))
            plan = {tid: cpus for tid, cpus in explicit.items() if tid in live}
        elif value == "kernel-default":
            plan = {int(k): parse_cpu_list(str(v)) for k, v in baseline.items()} if isinstance(baseline, dict) else {}
        else:
            cpus = [c for c in self.app if c in online] if value == "pack-app" else \
                [c for c in online if c not in self.app]
            if not cpus:
                raise KnobValueError(f"{self.key}: {value!r} leaves no CPU")
            plan = {tid: cpus for tid in vhost_threads(self.host)}
        for tid, cpus in plan.items():
            try:
                set_thread_affinity(self.host, tid, cpus)
            except HostError as e:
                if e.errno != 3:  # ESRCH: the worker exited (VM stopped); nothing to restore
                    raise

    def verify(self, value: KnobValue) -> bool:
        explicit = parse_affinity_map(str(value)) if value not in VHOST_STRATEGIES else None
        if explicit is not None:
            cur = self._current()
            return all(cur.get(str(t)) == format_cpu_list(c) for t, c in explicit.items() if str(t) in cur)
        return True if value == "kernel-default" else bool(self._current())

    def restore(self, state: JsonValue) -> None:
        self.write("kernel-default", baseline=state)

    def matches(self, state: JsonValue) -> bool:
        if not isinstance(state, dict):
            return False
        cur = self._current()
        return all(cur.get(k) == v for k, v in state.items() if k in cur)
