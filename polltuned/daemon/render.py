"""Text rendering of the status document (pure: JSON in, lines out)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from polltuned.daemon.watch import summarize


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [len(h) for h in headers]
    for r in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip()] + [fmt.format(*r).rstrip() for r in rows]


def _pct(x: Any) -> str:
    return "-" if not isinstance(x, (int, float)) else f"{x * 100:+.1f} %"


def study_lines(st: Mapping[str, Any] | None) -> list[str]:
    """The study store, its workload class and how many hosts share it (status and history)."""
    if not st:
        return []
    line = f"study:     {st.get('backend', '?')} {st.get('location', '?')}"
    ck, hosts = st.get("class_key"), st.get("hosts")
    if st.get("backend") == "postgresql":
        shared = (f", shared by {hosts} host{'' if hosts == 1 else 's'}" if isinstance(hosts, int)
                  else ", hosts not counted yet")
        line += f"; class {ck or '?'}{shared}; this host: {st.get('membership', '?')}"
    elif ck:
        line += f"; class {ck} (this host only)"
    out = [line]
    if st.get("fallback"):
        out.append(f"           {st['fallback']}")
    return out


def render_status(doc: Mapping[str, Any], *, running: bool, dirty: bool | None, now: float | None = None,
                  released: Sequence[str] = ()) -> str:
    """The status page: one section after the other, each from its part of the document.
    ``released``: knobs a clean host left as the admin set them (the last rollback released them)."""
    now = time.time() if now is None else now
    out = _header(doc, running=running, dirty=dirty, now=now, released=released)
    out += _progress(doc)
    out += study_lines(doc.get("study"))
    out += _knob_lines(doc)
    out += _result_lines(doc.get("result") or {})
    out += _guard_and_hold_lines(doc)
    out += _verification(doc.get("last_verification"), now)
    out += _reload_and_recommendation_lines(doc)
    out += _counter_lines(doc.get("counters") or {})
    return "\n".join(out)


def _header(doc: Mapping[str, Any], *, running: bool, dirty: bool | None, now: float,
            released: Sequence[str] = ()) -> list[str]:
    out: list[str] = []
    if running:
        age = now - float(doc.get("updated", now))
        out.append(f"polltuned: running (pid {doc.get('pid', '?')}), policy {doc.get('policy', '?')}"
                   + (f", nic {doc['nic']}" if doc.get("nic") else ""))
        out.append(f"phase:     {doc.get('phase', '?')}"
                   + (f" — {doc['message']}" if doc.get("message") else "")
                   + f"   (updated {age:.0f} s ago)")
        return out
    clean = ("clean: no polltuned value is applied; left as the admin set them (released): "
             + ", ".join(released)) if released else "clean: every knob has its original value"
    state = ("in an UNKNOWN state (host state unknown: the journal is damaged, unverified, or unreadable by "
             "this user)" if dirty is None else
             "DIRTY: polltuned values are still applied" if dirty else clean)
    out.append(f"polltuned: not running; host is {state}")
    if doc and doc.get("phase") not in ("STOPPED", "DONE"):
        # the status file still shows a working phase: the daemon was killed or crashed there
        out.append(f"last run:  policy {doc.get('policy', '?')}, did not stop normally (killed or crashed) "
                   f"while in phase {doc.get('phase', '?')}")
    elif doc:
        out.append(f"last run:  policy {doc.get('policy', '?')}, ended in phase {doc.get('phase', '?')}"
                   + (f" — {doc['message']}" if doc.get("message") else ""))
    if dirty:
        out.append("           undo with: polltuned rollback")
    return out


def _progress(doc: Mapping[str, Any]) -> list[str]:
    prog = doc.get("progress") or {}
    if not prog:
        return []
    return [f"progress:  trial {_fmt(prog.get('trial'))}, "
            f"measurement windows {_fmt(prog.get('windows_used'))} of {_fmt(prog.get('windows_budget'))} "
            f"(the budget), tuning round {_fmt(prog.get('round'))}"]


def _knob_lines(doc: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    knobs = doc.get("knobs") or []
    if knobs:
        out.append("")
        rows = [[str(k.get("key")), _fmt(k.get("original")), _fmt(k.get("current")), _fmt(k.get("best")),
                 _owner(k)] for k in knobs]
        out += _table(["knob", "original", "current", "best", "owner"], rows)
    dropped = doc.get("dropped_knobs") or {}
    if dropped:
        out.append("")
        out.append("not tuned on this host (dropped at start):")
        for key, why in sorted(dropped.items()):
            out.append(f"  {key}: {why}")
    return out


def _result_lines(res: Mapping[str, Any]) -> list[str]:
    """The last round: how it ran (resume, observe, search), the objective, the confirmation."""
    if not res:
        return []
    out = [""]
    mode = res.get("mode")
    if mode == "resume":
        out.append("round: resumed a confirmed configuration for this policy and host (no new search): "
                   + str(res.get("reason", "")))
    elif mode == "observe":
        out.append("round: observe mode, nothing written: " + str(res.get("reason", "")))
        base = res.get("baseline_config") or {}
        for c in (res.get("would_try") or [])[:8]:
            diff = ", ".join(f"{k}={v}" for k, v in c.items() if base.get(k) != v)
            out.append(f"  would try: {diff or '(baseline values)'}")
    elif mode == "search":
        noise = res.get("window_noise_sd")
        out.append(f"round: full search ({_fmt(res.get('windows_used'))} windows; window-to-window noise "
                   + (f"{noise:.2f} in log J" if isinstance(noise, (int, float)) else "unknown") + ")")
    obj = res.get("objective_name", "objective")
    b, c = res.get("baseline_objective"), res.get("best_objective")
    line = f"{obj}: baseline {_fmt(b)} -> best {_fmt(c)}"
    if isinstance(b, (int, float)) and isinstance(c, (int, float)) and b:
        line += f" ({(c - b) / b * 100:+.1f} %)"
    out.append(line)
    conf = res.get("confirmation") or {}
    if conf:
        ci = conf.get("ci") or [None, None]
        out.append(
            f"confirmation: {conf.get('verdict', '?')} — gain {_pct(conf.get('gain'))} "
            f"(95 % CI {_pct(ci[0])} … {_pct(ci[1])}, p = {_fmt(conf.get('p_value'))}, "
            f"{_fmt(conf.get('pairs'))} interleaved pairs)"
            + (f"; {conf['reason']}" if conf.get("reason") and not str(conf["reason"]).startswith("gain") else "")
        )
    return out


def _guard_and_hold_lines(doc: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    guards = doc.get("guard_events") or []
    if guards:
        out.append("")
        out.append("guard events (latest last):")
        for g in guards[-5:]:
            out.append(f"  trial {_fmt(g.get('trial'))}: {g.get('message', '')}")
    return out + hold_lines(doc.get("hold") or {})


def hold_lines(hold: Mapping[str, Any]) -> list[str]:
    """HOLD: the load now, the table of deployments by load region (the active one marked, and
    why it is there), windows spent exploring."""
    if not hold or not hold.get("table"):
        return []
    ctx = hold.get("context") or {}
    out = ["", f"hold: {hold.get('windows', 0)} windows since the first decision, "
               f"{hold.get('exploring', 0)} exploring ({_pct_plain(hold.get('explore_share'))}), "
               f"{hold.get('switches', 0)} switches, {hold.get('fallbacks', 0)} fallback checks",
           "load now: " + (", ".join(f"{k} {_fmt(v)}" for k, v in sorted(ctx.items())) or "no context signals")
           + f" (region {_fmt(hold.get('region'))})"]
    rows = []
    for e in hold.get("table") or []:
        diff = ", ".join(f"{k}={v}" for k, v in (e.get("diff") or {}).items()) or "(the originals)"
        shares = e.get("shares") or {}
        if shares:
            diff += " [" + ", ".join(f"{k} {v * 100:.0f} %" for k, v in shares.items()) + "]"
        rows.append([("* " if e.get("active") else "  ") + str(e.get("region")), diff, _pct(e.get("gain")),
                     _pct(e.get("ci_low")), str(e.get("why", ""))[:70]])
    out += _table(["  region", "configuration [share of the gain]", "gain", "CI low", "why"], rows)
    pending = hold.get("pending") or []
    if pending:
        out.append("waiting for their load (a load change cut the confirmation; it goes on when the load is "
                   "back): region " + ", ".join(str(r) for r in pending))
    return out


def _reload_and_recommendation_lines(doc: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    reloads = doc.get("reloads") or []
    if reloads and isinstance(reloads[-1], Mapping):
        last = reloads[-1]
        out.append("")
        out.append(f"last reload: {last.get('outcome', '?')} in phase {last.get('phase', '?')}, policy "
                   f"{last.get('policy', '?')}" + (f" — {last['message']}" if last.get("message") else ""))
    rec = doc.get("recommendations") or {}
    if rec:
        out.append("")
        for k, v in rec.items():
            out.append(f"recommend: {k} = {_fmt(v.get('value') if isinstance(v, Mapping) else v)}"
                       + (f"  ({v.get('why')})" if isinstance(v, Mapping) and v.get("why") else ""))
    return out


def _counter_lines(cnt: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    cpus = cnt.get("cpus") or []
    if cpus:
        out.append("")
        rows = [[str(c.get("cpu")), _fmt(c.get("net_rx_per_s")), _fmt(c.get("irqs_per_s")),
                 _pct_plain(c.get("softirq")), _pct_plain(c.get("system")), _fmt(c.get("runq_wait_ms_per_s"))]
                for c in cpus[:16]]
        out += _table(["cpu", "NET_RX/s", "IRQ/s", "softirq", "system", "runq wait ms/s"], rows)
        if len(cpus) > 16:
            out.append(f"… {len(cpus) - 16} more CPUs (polltuned top shows all)")
    unavailable = cnt.get("unavailable") or {}
    if unavailable:
        out.append("counters unavailable: " + ", ".join(f"{k} ({v})" for k, v in sorted(unavailable.items())))
    return out


def _owner(k: Mapping[str, Any]) -> str:
    owner = str(k.get("owner", "-"))
    parts = k.get("released_parts") or []
    if parts and owner.endswith("(partly released)"):
        owner = owner[:-1] + ": " + ", ".join(map(str, parts)) + " left to the admin)"
    return owner + (f" ({k['note']})" if k.get("note") else "")


#: watcher states, as the status page words them (polltuned.daemon.watch)
_VERIFY_WORDS = {"reapplied": "re-applied", "released": "released", "partly-released": "partly released",
                 "gone": "gone", "failed": "failed", "interrupted": "interrupted", "admin": "left to the admin"}


def _verification(ver: Any, now: float) -> list[str]:
    """The last verification of the deployed knobs (HOLD): when, why, counts, what changed."""
    if not isinstance(ver, Mapping) or not ver:
        return []

    t = ver.get("t")
    when = f"{max(0.0, now - float(t)):.0f} s ago" if isinstance(t, (int, float)) else "?"
    out = ["", f"verification: {when} ({ver.get('trigger', '?')}): "
               + (f"skipped: {ver['error']}" if ver.get("error") else summarize(ver.get("counts") or {}))]
    for ch in ver.get("changes") or []:
        if not isinstance(ch, Mapping) or ch.get("state") == "admin":
            continue
        word = _VERIFY_WORDS.get(str(ch.get("state")), str(ch.get("state")))
        out.append(f"  {word:<17} {ch.get('key')}" + (f" — {ch['detail']}" if ch.get("detail") else ""))
    totals = ver.get("totals") or {}
    if totals:
        out.append(f"  since start: {ver.get('verifications', '?')} verifications; "
                   + ", ".join(f"{_VERIFY_WORDS.get(k, k)} {v}" for k, v in sorted(totals.items())))
    return out


def _pct_plain(x: Any) -> str:
    return "-" if not isinstance(x, (int, float)) else f"{x * 100:.1f} %"
