"""The policy schema.

A policy says which knobs to tune and within which bounds, how to measure (the probe), how to
score a window (the objective and its constraints), how careful to be (guard, confirmation), and
what to do afterwards (hold, on_exit). Unknown fields are errors (extra="forbid").

Knob keys use kernel vocabulary verbatim: ``net.core.busy_poll``, ``kernel.timer_migration``,
``{nic}:gro_flush_timeout`` (``{nic}`` is replaced by the policy's ``nic`` or the CLI's
``--nic``), ``{nic}:napi:irq-suspend-timeout`` (per-NAPI netlink), ``{nic}:irq_affinity``
(a strategy name), ``module:haltpoll:guest_halt_poll_ns``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from polltuned.knobs.keys import KnobKey, host_device, parse_keys
from polltuned.policy.names import OPTIMISER_NAMES


class _Strict(BaseModel):
    # inf/nan (TOML has both, and 1e400 overflows to inf) are never a meaningful bound or duration
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class KnobSpec(_Strict):
    """One dimension of the search space.

    Numeric knobs give ``min``/``max`` (inclusive); categorical knobs give ``values``.
    ``scale = "log"`` searches log-uniformly over the non-zero part; ``zero_is_off`` makes 0 an
    explicit "off" choice outside that log range (the optimiser sees a separate on/off switch).
    ``seeds`` are domain-known good values tried early (kernel docs: busy_poll 50).
    ``requires_nonzero`` makes the knob conditional: it only matters when every listed knob is
    non-zero; otherwise it is pinned to ``off_value`` and not searched.
    """

    type: Literal["int", "float", "categorical"] = "int"
    min: float | None = None
    max: float | None = None
    values: list[str | int] | None = None
    scale: Literal["linear", "log"] = "linear"
    zero_is_off: bool = False
    seeds: list[str | int | float] = Field(default_factory=list)
    requires_nonzero: list[str] = Field(default_factory=list)
    off_value: str | int | float | None = None
    description: str = ""

    @model_validator(mode="after")
    def _check(self) -> KnobSpec:
        if self.type == "categorical":
            if not self.values:
                raise ValueError(f"categorical knob needs a non-empty 'values' list (got {self.values!r})")
            if self.min is not None or self.max is not None:
                raise ValueError("categorical knob takes 'values', not min/max")
            for s in self.seeds:
                if s not in self.values:
                    raise ValueError(f"seed {s!r} is not one of values {self.values!r}")
            return self
        if self.min is None or self.max is None:
            raise ValueError(f"numeric knob needs both min and max (got min={self.min}, max={self.max})")
        if self.max < self.min:
            raise ValueError(f"max must be >= min (got max={self.max:g}, min={self.min:g})")
        if self.values is not None:
            raise ValueError("numeric knob takes min/max, not 'values'")
        if self.type == "int" and (self.min != int(self.min) or self.max != int(self.max)):
            raise ValueError(f"int knob needs integer bounds (got min={self.min}, max={self.max})")
        if self.scale == "log":
            lo = self.min if not self.zero_is_off else max(self.min, 1)
            if lo <= 0:
                raise ValueError(
                    f"log scale needs min > 0 or zero_is_off = true (got min={self.min:g})"
                )
        if self.zero_is_off and self.min != 0:
            raise ValueError(f"zero_is_off needs min = 0 (got min={self.min:g})")
        for s in self.seeds:
            if isinstance(s, str) or not (self.min <= s <= self.max):
                raise ValueError(f"seed {s!r} outside [{self.min:g}, {self.max:g}]")
        return self


class _ProbeBase(_Strict):
    unit: str | None = Field(None, pattern=r"^[A-Za-z0-9:_.@\\-]+$", description=(
        "systemd unit of the measured service (nginx.service): the objective's CPU is its cgroup's cpu.stat"))


class SockperfProbe(_ProbeBase):
    kind: Literal["sockperf"] = "sockperf"
    target: str = "198.18.0.2"
    port: int = Field(11111, ge=1, le=65535)
    mode: Literal["ping-pong", "under-load"] = "ping-pong"
    rate_mps: int | None = Field(None, ge=1, description="messages/s for under-load")
    msg_size: int = Field(64, ge=14, le=65000)
    protocol: Literal["udp", "tcp"] = "udp"
    netns: str | None = None
    cpu: int | None = Field(None, ge=0)
    restart_server: bool = True
    server_netns: str | None = None
    server_cpu: int | None = Field(None, ge=0)
    sessions: int = Field(1, ge=1, le=64)
    timeout_s: float = Field(30.0, gt=0)
    histogram: bool = Field(False, description=(
        "log every sample (sockperf --full-log to stdout): the window keeps an exact latency histogram and "
        "parallel sessions merge exactly (about 40 bytes of output per message)"))


class TcpRttProbe(_ProbeBase):
    kind: Literal["tcp_rtt"] = "tcp_rtt"
    port: int | None = Field(None, ge=1, le=65535)
    side: Literal["src", "dst", "any"] = "any"
    address: str | None = None
    netns: str | None = None
    sample_interval_s: float = Field(0.2, gt=0)
    min_sockets: int = Field(1, ge=1)


class PrometheusProbe(_ProbeBase):
    kind: Literal["prometheus"] = "prometheus"
    url: str
    metric: str = Field(description="histogram base name, e.g. http_request_duration_seconds")
    labels: dict[str, str] = Field(default_factory=dict)
    unit_scale_us: float = Field(1e6, gt=0, description="multiply bucket bounds by this to get µs")
    timeout_s: float = Field(5.0, gt=0)


class CommandProbe(_ProbeBase):
    """Run ``argv`` once per window and read the statistics it prints (regex or JSON path).

    ``argv`` may use ``{window_s}`` (the window length in seconds), ``{window_s_int}`` (the same
    rounded to whole seconds, at least 1: ``wrk -d {window_s_int}s``) and ``{python}`` (the Python
    interpreter running polltuned, for clients shipped with it).
    ``netns`` / ``cpus`` run the command inside a network namespace / pinned to CPUs.
    ``fresh_sockets`` declares whether the sockets whose latency this probe measures are created
    fresh in every window (a client *and* server started per window: busy_read, which is copied
    into a socket at creation, acts on them). A long-running server measured by a fresh client
    (nginx + wrk, memcached + a client) is ``false``: its accepted sockets are cloned from a
    listener created before the change.

    Open loop: ``rate`` (requests/s) and ``arrivals`` fill the ``{rate}`` and ``{arrivals}``
    placeholders (``"--rate", "{rate}", "--arrivals", "{arrivals}"`` for the shipped kvclient and
    httpclient); a rate without ``{rate}`` in argv, or the reverse, is an error (a rate nobody sends
    at). ``histogram_path``: the JSON path of the encoded latency histogram the command prints
    (polltuned.histogram; the shipped clients: ``$.histogram.encoded``): the window keeps it and
    its latency percentiles come from it.
    """

    kind: Literal["command"] = "command"
    argv: list[str] = Field(min_length=1)
    netns: str | None = None
    cpus: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    fresh_sockets: bool = False
    regex: str | None = None
    json_path: str | None = None
    statistic_map: dict[str, str] = Field(
        default_factory=dict,
        description="statistic name (p50, p99, ...) -> regex group name or JSON path; overrides regex/json_path",
    )
    unit_scale_us: float = Field(
        1.0, gt=0, description="µs per unit of a latency printed without a unit (numbers with us/ms/s are converted)")
    timeout_s: float = Field(120.0, gt=0, le=86_400)
    rate: float | None = Field(None, gt=0, le=1e6, description="open-loop requests/s, the argv's {rate}")
    arrivals: Literal["poisson", "uniform"] = Field("poisson", description="open-loop arrivals, the argv's {arrivals}")
    histogram_path: str | None = Field(None, min_length=1, description=(
        "JSON path of the encoded HdrHistogram in the output (the shipped clients: $.histogram.encoded)"))

    @model_validator(mode="after")
    def _check(self) -> CommandProbe:
        if not (self.regex or self.json_path or self.statistic_map):
            raise ValueError("command probe needs 'regex', 'json_path' or 'statistic_map'")
        uses_rate = any("{rate}" in a for a in self.argv)
        if self.rate is not None and not uses_rate:
            raise ValueError(f"rate = {self.rate:g} but argv has no {{rate}} placeholder: nothing would send at it")
        if uses_rate and self.rate is None:
            raise ValueError("argv uses {rate} but the probe sets no 'rate' (requests/s)")
        if self.histogram_path is not None and self.regex:
            raise ValueError("histogram_path needs JSON output (it cannot be combined with 'regex')")
        if self.regex is not None:
            import re

            try:
                re.compile(self.regex)
            except re.error as e:
                raise ValueError(f"regex: not a valid regular expression: {e} (got {self.regex!r})") from None
        return self


class SimProbe(_ProbeBase):
    kind: Literal["sim"] = "sim"
    scenario: str = Field(description="path to a scenario .py file, or the name of a shipped scenario")


Probe = Annotated[
    SockperfProbe | TcpRttProbe | PrometheusProbe | CommandProbe | SimProbe,
    Field(discriminator="kind"),
]


class Constraints(_Strict):
    cpu_budget_cores: float | None = Field(None, gt=0)
    throughput_floor_pps: float | None = Field(None, ge=0)
    max_drops_increase_per_s: float | None = Field(None, ge=0)


class Objective(_Strict):
    """How one window becomes a number to minimise.

    latency            : J = L
    latency_x_cpu      : J = L * (1 + cpu_weight * cpu_cores)
    latency_cpu_budget : J = L, infeasible when cpu_cores > constraints.cpu_budget_cores
    cpu_per_throughput : J = cpu_cores / throughput (lower is better), latency ceiling as constraint
    """

    statistic: Literal["p50", "p90", "p99", "p999", "mean"] = "p99"
    combine: Literal["latency", "latency_x_cpu", "latency_cpu_budget", "cpu_per_throughput"] = "latency_x_cpu"
    cpu_weight: float = Field(0.25, ge=0)
    latency_ceiling_us: float | None = Field(None, gt=0)
    constraints: Constraints = Field(default_factory=Constraints)

    @model_validator(mode="after")
    def _check(self) -> Objective:
        if self.combine == "latency_cpu_budget" and self.constraints.cpu_budget_cores is None:
            raise ValueError("combine = 'latency_cpu_budget' needs constraints.cpu_budget_cores")
        return self


class Tuning(_Strict):
    budget: int = Field(30, ge=1, le=10_000, strict=True,
                        description="measurement windows for the search, repeats included")
    window_s: float = Field(5.0, gt=0, le=86_400, description="seconds (at most a day)")
    settle_s: float = Field(1.0, ge=0, le=86_400, description="seconds (at most a day)")
    repeats: int = Field(1, ge=1, le=20, strict=True, description="windows per trial")
    optimiser: str = Field("skopt", description="an optimiser of polltuned.policy.names.OPTIMISER_NAMES")
    initial_points: int = Field(6, ge=1, strict=True)
    seed: int = Field(0, ge=0, le=2**32 - 1, strict=True)
    warm_start: bool = True


    @model_validator(mode="after")
    def _known_optimiser(self) -> Tuning:
        if self.optimiser not in OPTIMISER_NAMES:
            raise ValueError(f"optimiser must be one of {', '.join(OPTIMISER_NAMES)} (got {self.optimiser!r})")
        return self


class Guard(_Strict):
    max_regression: float = Field(
        1.0, gt=0, description="abort a trial whose first window is worse than baseline by more than this fraction"
    )


class Confirm(_Strict):
    pairs: int = Field(4, ge=2, le=50, description="A/B pairs before the first look")
    looks: int = Field(3, ge=1, le=6, description="sequential looks, at pairs x 1, 2, 4 ...: noisy hosts get "
                                                  "more pairs, decided hosts stop early (alpha split over the looks)")
    alpha: float = Field(0.05, gt=0, lt=0.5)
    min_effect: float = Field(0.05, ge=0, lt=1, description="minimum relative improvement to deploy")
    futility: float = Field(0.5, ge=0, le=1, description="while following the load (the daemon): a look "
                            "before the last whose gain estimate is below futility x min_effect stops the "
                            "comparison (never deploys more; 0 = only the CI rule)")


class Hold(_Strict):
    """HOLD: the engine keeps measuring the active deployment (a window every ``interval_s``), falls
    back to the originals when it gets worse, keeps a table of confirmed deployments by load region
    (polltuned.engine.hold), switches between them as the load moves, and tries challengers."""

    interval_s: float = Field(10.0, gt=0)
    drift_threshold: float = Field(0.3, gt=0, description="unused since the region table replaced drift "
                                   "detection (accepted so older policies still load)")
    drift_windows: int = Field(3, ge=1, description="usable windows in HOLD before a round whose baseline "
                               "could not be measured (no traffic yet) starts again")
    retune: bool = Field(True, description="search a load region never confirmed (false: the originals there)")
    fallback_windows: int = Field(2, ge=1, description="HOLD windows worse than the active entry's confirmed "
                                  "level by more than the guard limit before it is measured against the "
                                  "originals (interleaved) and replaced by them if they win")
    region_radius: float = Field(0.7, gt=0, description="a context further than this from every region centre "
                                 "(largest per-signal difference of log(1 + x)) founds a new load region")
    max_regions: int = Field(4, ge=1, le=16, description="at most this many load regions in the table")
    switch_windows: int = Field(2, ge=1, description="consecutive HOLD windows in another region before "
                                "switching to its confirmed entry (or searching it)")
    min_switch_interval: int = Field(4, ge=1, description="at least this many HOLD windows between two "
                                     "switches (no flapping at a region boundary)")
    region_budget: int = Field(12, ge=4, description="windows of the short search for a region never confirmed")
    region_design: int = Field(4, ge=0, le=32, description="space-filling trials at the start of a region's "
                               "search (after the other regions' entries): a new load is searched over the "
                               "whole space, not only where the model learnt from the other loads")
    explore_share: float = Field(0.05, ge=0, le=0.5, description="share of HOLD windows that measure "
                                 "challengers against the active entry (interleaved pairs)")
    verify_every: int = Field(3, ge=0, description="verify the deployed knobs every N HOLD windows (kernel reset: "
                              "re-applied; admin change: released); 0 = only on link events")
    keep_knobs: Literal["likely", "proven"] = Field(
        "likely", description="before a deployment, a knob beside the one that carries the gain stays when "
        "the model's mean cost of putting it back reaches the confirmation's first-look resolution "
        "(likely), or only when the lower bound (mean - sd) of that cost does (proven: fewer knobs, "
        "measured 2-4 points less often within 5 % of the optimum)")


class Policy(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    include: list[str] = Field(default_factory=list)
    nic: str | None = None
    app_cpus: list[int] = Field(default_factory=list)
    knobs: dict[str, KnobSpec] = Field(min_length=1)
    probe: Probe
    objective: Objective = Field(default_factory=Objective)
    tuning: Tuning = Field(default_factory=Tuning)
    guard: Guard = Field(default_factory=Guard)
    confirm: Confirm = Field(default_factory=Confirm)
    hold: Hold = Field(default_factory=Hold)
    on_exit: Literal["restore", "keep"] = "restore"
    mode: Literal["tune", "observe"] = Field(
        "tune", description="observe: measure and report the baseline and what would be tried, write nothing")

    @model_validator(mode="after")
    def _check(self) -> Policy:
        for key, spec in self.knobs.items():
            if "{nic}" in key and self.nic is None:
                pass  # resolved later with --nic; checked by resolve_nic()
            for dep in spec.requires_nonzero:
                if dep not in self.knobs:
                    raise ValueError(f"knobs.{key}.requires_nonzero: {dep!r} is not a knob of this policy")
        return self

    @cached_property
    def knob_keys(self) -> dict[str, KnobKey]:
        """Every knob key of the policy, parsed (the ``{nic}`` placeholder allowed until
        ``resolve_nic``). The loader has refused keys that do not parse, so this raises KnobKeyError
        only for a policy built around it. Computed once per policy object (``model_copy`` drops it)."""
        return parse_keys(self.knobs, placeholder_ok=True)

    @property
    def nic_device(self) -> str | None:
        """The host-netns device name of the policy's nic; None for no nic, the ``{nic}``
        placeholder or a device inside a named netns (``NETNS/DEV``)."""
        return host_device(self.nic)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Policy:
        """A copy (pydantic's), without the parsed keys of this one: a copy that changes ``knobs``
        parses its own."""
        new = super().model_copy(update=update, deep=deep)
        new.__dict__.pop("knob_keys", None)
        return new

    def resolve_nic(self, nic: str | None = None) -> Policy:
        """Return a copy with ``{nic}`` substituted in knob keys (``nic`` overrides the policy's)."""
        name = nic or self.nic
        if not any("{nic}" in k for k in self.knobs):
            return self if nic is None else self.model_copy(update={"nic": nic})
        if name is None:
            raise ValueError("knob keys use {nic} but no nic is set (policy 'nic' or --nic)")

        def sub(k: str) -> str:
            return k.replace("{nic}", name)

        knobs = {
            sub(k): v.model_copy(update={"requires_nonzero": [sub(d) for d in v.requires_nonzero]})
            for k, v in self.knobs.items()
        }
        return self.model_copy(update={"knobs": knobs, "nic": name})
