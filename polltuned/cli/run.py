"""``polltuned run``: the foreground daemon (systemd ExecStart, Type=notify)."""

from __future__ import annotations

import argparse
import logging

from polltuned.cli._types import finite_float, int_range
from polltuned.cli.main import DEFAULT_RUN_DIR, DEFAULT_STATE_DIR
from polltuned.cli.simulate import prepare
from polltuned.clock import Clock, ScaledClock, SystemClock
from polltuned.daemon.config import DaemonConfig, load_config
from polltuned.daemon.metrics import build_exporter
from polltuned.daemon.service import Service
from polltuned.daemon.status import clear_kept, mark_kept, read_kept
from polltuned.daemon.statusdoc import build_status
from polltuned.daemon.wiring import build_daemon, load_daemon_policy
from polltuned.errors import ExitCode
from polltuned.host.systemd import Notifier, setup_logging


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="daemon config (TOML), e.g. /etc/polltuned/polltuned.toml")
    p.add_argument("--policy", help="policy name or file (overrides the config's)")
    p.add_argument("--nic", help="network device the policy's {nic} knobs refer to (overrides policy and config)")
    p.add_argument("--max-rounds", type=int_range(1, 10**6), default=None, metavar="N",
                   help="stop after N tuning rounds instead of holding forever (for demos and tests)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default=None,
                   help="log verbosity (default: the config's log_level, info)")
    p.add_argument("--observe", action="store_true",
                   help="look before touching: measure the baseline and counters and report what would be "
                        "tried, without writing any knob (same as mode = \"observe\" in the policy)")
    p.add_argument("--simulate", metavar="SCENARIO", default=None,
                   help="run the policy's knobs and objective against a simulated world instead of the real "
                        "workload: its probe is replaced by the sim probe of SCENARIO (shipped name or .py file, "
                        "see `polltuned sim --list`); needs a fake tree as --host-root (default: a temporary one), "
                        "never touches the real kernel; state and run dirs default to a temporary directory")
    p.add_argument("--sim-speed", type=finite_float(0, 1e6, lo_open=False), default=100.0, metavar="X",
                   help="with --simulate: simulated time runs X times faster than real time (0 = no waiting; "
                        "default 100)")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config) if args.config else DaemonConfig()
    state_dir = args.state_dir if args.state_dir != DEFAULT_STATE_DIR else cfg.state_dir
    run_dir = args.run_dir if args.run_dir != DEFAULT_RUN_DIR else cfg.run_dir
    setup_logging(args.log_level or cfg.log_level)
    log = logging.getLogger("polltuned.daemon")

    def policy_ref() -> tuple[str, str | None]:
        c = load_config(args.config) if args.config else cfg
        return (args.policy or c.policy, args.nic or c.nic)

    ref, nic = policy_ref()
    policy = load_daemon_policy(ref, nic)
    clock: Clock = SystemClock()
    host_root, sim = args.host_root, None
    if getattr(args, "simulate", None):
        sim = prepare(args, policy)
        policy, host_root, state_dir, run_dir = sim.swap_probe(policy), sim.host_root, sim.state_dir, sim.run_dir
        clock = ScaledClock(args.sim_speed)
    d = build_daemon(policy=policy, host_root=host_root, state_dir=state_dir, clock=clock,
                     max_rounds=args.max_rounds, observe=bool(getattr(args, "observe", False)),
                     study=cfg.study)
    # the keep marker of the previous run counts only for the journal epoch it was written in
    marker = read_kept(state_dir)
    if marker is not None:
        st = d.actuator.state()
        if marker.applies_to(st.epoch, st.open):
            def forget() -> None:
                clear_kept(state_dir)

            d.controller.kept = True
            d.controller.forget_kept = forget
        else:
            log.info("ignoring a stale keep marker (epoch %s; the journal is at epoch %s, %s)", marker.epoch,
                     st.epoch, "open" if st.open else "clean")
            clear_kept(state_dir)

    def reload_policy() -> object:
        r, n = policy_ref()
        pol = load_daemon_policy(r, n)
        return d.fit(sim.swap_probe(pol) if sim is not None else pol)

    metrics = None
    if cfg.metrics.http_address is not None or cfg.metrics.textfile is not None:
        metrics = build_exporter(cfg.metrics, clock)
    service = Service(controller=d.controller, notifier=Notifier(), run_dir=run_dir, clock=clock,
                      build_status=lambda c: build_status(d, c), reload_policy=reload_policy,  # type: ignore[arg-type]
                      status_interval_s=cfg.status_interval_s,
                      hold_status_interval_s=cfg.hold_status_interval_s, metrics=metrics)
    log.info("starting: policy %s, host root %s, state %s", policy.name, host_root, state_dir,
             extra={"policy": policy.name})
    rc = service.run()
    # a clean exit: with on_exit = keep, ExecStopPost (rollback --if-dirty) must leave this epoch alone
    st = d.actuator.state()
    if d.controller.policy.on_exit == "keep" and st.open:
        mark_kept(state_dir, epoch=st.epoch, policy=d.controller.policy.name, t=clock.wall())
    else:
        clear_kept(state_dir)
    log.info("stopped (%s)", d.controller.message)
    if sim is not None:
        sim.close()
    return rc if rc else int(ExitCode.OK)
