"""Knob keys: one typed parser (polltuned.knobs.keys), used by the registry and by the policy loader,
which refuses unknown and malformed keys with file, field, value, rule and a did-you-mean hint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from polltuned.cli.main import main
from polltuned.errors import PolicyError, UsageError
from polltuned.knobs.keys import KnobKeyError, catalogue_patterns, parse_key, suggest
from polltuned.policy.loader import load_policy

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("key", "kind", "attr", "dev"), [
    ("net.core.busy_poll", "sysctl", "net.core.busy_poll", None),
    ("kernel.timer_migration", "sysctl", "kernel.timer_migration", None),
    ("eth0:gro_flush_timeout", "netdev-sysfs", "gro_flush_timeout", "eth0"),
    ("ptb-s/ptbs:threaded", "netdev-sysfs", "threaded", "ptb-s/ptbs"),
    ("eth0:napi:irq-suspend-timeout", "netdev-napi", "irq-suspend-timeout", "eth0"),
    ("ens1f0:irq_affinity", "irq-affinity", "irq_affinity", "ens1f0"),
    ("eth0:coalesce:rx-usecs", "ethtool-coalesce", "rx-usecs", "eth0"),
    ("module:kvm:halt_poll_ns", "module-param", "halt_poll_ns", None),
    ("module:vhost_net:experimental_zcopytx", "module-param", "experimental_zcopytx", None),
    ("vhost:affinity", "vhost-affinity", "affinity", None),
])
def test_valid_keys_parse_into_typed_keys(key: str, kind: str, attr: str, dev: str | None) -> None:
    k = parse_key(key)
    assert (k.kind, k.attr, k.text, str(k)) == (kind, attr, key, key)
    assert (k.device.label if k.device else None) == dev


@pytest.mark.parametrize(("key", "rule", "hint"), [
    ("net.core.busy_pol", "unknown sysctl: polltuned tunes net.core.busy_read", "net.core.busy_poll"),
    ("busy_read", "unknown sysctl", "net.core.busy_read"),
    ("gro_flush_timeout", "unknown sysctl", "{nic}:gro_flush_timeout"),
    ("eth0:gro_flush_timout", "unknown device knob: DEV: is followed by one of", "eth0:gro_flush_timeout"),
    ("eth0:napi:irq-suspend", "unknown device knob", "eth0:napi:irq-suspend-timeout"),
    ("module:kvm:halt_pol_ns", "module kvm has no tunable parameter 'halt_pol_ns'", "module:kvm:halt_poll_ns"),
    ("module:kmv:halt_poll_ns", "unknown module 'kmv'", "module:kvm:halt_poll_ns"),
    ("module:kvm", "module parameter keys are module:NAME:PARAM", "module:kvm:halt_poll_ns"),
    ("vhost:afinity", "the only vhost key is vhost:affinity", "vhost:affinity"),
    ("a/b/c:threaded", "is not an interface name", None),
    ("averyveryverylongname:threaded", "is not an interface name", None),
    ("ns/eth0:irq_affinity", "IRQ affinity applies to physical devices of the host netns", None),
    ("{nic}:threaded", "the {nic} placeholder is not resolved", None),   # only in policy files
    (" net.core.busy_poll", "without surrounding spaces", None),
])
def test_bad_keys_name_the_rule_and_the_closest_key(key: str, rule: str, hint: str | None) -> None:
    with pytest.raises(KnobKeyError) as ei:
        parse_key(key)
    e = ei.value
    assert rule in e.rule, e.rule
    assert e.suggestion == hint
    assert isinstance(e, UsageError) and e.exit_code == 2 and e.code == "knob-unknown"
    assert e.message.endswith(f"; did you mean {hint}?") if hint else "did you mean" not in e.message


def test_placeholder_and_catalogue() -> None:
    assert parse_key("{nic}:napi:gro-flush-timeout", placeholder_ok=True).kind == "netdev-napi"
    pats = catalogue_patterns("eth0")
    for p in pats:
        assert parse_key(p).text == p            # every catalogue shape parses
    assert "eth0:napi:irq-suspend-timeout" in pats and "vhost:affinity" in pats
    assert suggest("zzzz") is None


def _policy(tmp: Path, key: str) -> Path:
    p = tmp / "p.toml"
    p.write_text(f'name = "t"\n[probe]\nkind = "sim"\nscenario = "cliff"\n[knobs."{key}"]\nmin = 0\nmax = 10\n')
    return p


def test_loader_one_line_with_file_field_value_rule_hint(tmp_path: Path) -> None:
    p = _policy(tmp_path, "net.core.busy_pol")
    with pytest.raises(PolicyError) as ei:
        load_policy(str(p))
    (line,) = ei.value.problems
    assert line == (f"{p}: knobs.net.core.busy_pol: unknown sysctl: polltuned tunes net.core.busy_read, "
                    "net.core.busy_poll, net.core.gro_normal_batch, kernel.timer_migration, net.core.netdev_budget, "
                    "net.core.netdev_budget_usecs (got 'net.core.busy_pol'); did you mean net.core.busy_poll?")
    assert "\n" not in line


@pytest.mark.parametrize("key", ["net.core.busy_pol", "eth0::threaded", "module:kvm", "x/y/z:threaded"])
def test_check_exit_2_same_for_unknown_and_malformed(tmp_path: Path, key: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", str(_policy(tmp_path, key))])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("polltuned: error[policy-invalid]: ")
    assert f"knobs.{key}: " in lines[0] and f"(got {key!r})" in lines[0]


def test_run_refuses_a_misspelled_key_at_load(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "polltuned", "--state-dir", str(tmp_path / "s"), "--run-dir",
                        str(tmp_path / "r"), "run", "--policy", str(_policy(tmp_path, "net.core.busy_pol"))],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "did you mean net.core.busy_poll?" in r.stderr


def test_a_nic_that_makes_bad_keys_is_refused() -> None:
    with pytest.raises(PolicyError) as ei:
        load_policy("latency-critical", nic="a b")
    (line,) = ei.value.problems
    assert ": nic: device 'a b' is not an interface name" in line and "(got 'a b')" in line


def test_every_shipped_policy_key_parses() -> None:
    for p in sorted((REPO / "policies").glob("*.toml")):
        pol = load_policy(p.stem, nic="eth0")
        for key in pol.knobs:
            parse_key(key)


def test_the_policy_carries_its_parsed_keys_and_one_answer_for_its_nic() -> None:
    pol = load_policy("latency-critical", nic="eth0")
    keys = pol.knob_keys
    assert set(keys) == set(pol.knobs) and all(k.text == t for t, k in keys.items())
    assert pol.knob_keys is keys                                   # parsed once per policy object
    from polltuned.policy.loader import policy_from_dict

    raw = policy_from_dict({"name": "t", "probe": {"kind": "sim", "scenario": "cliff"},
                            "knobs": {"{nic}:gro_flush_timeout": {"min": 0, "max": 10},
                                      "net.core.busy_poll": {"min": 0, "max": 10}}})
    assert [k.host_device for k in raw.knob_keys.values()] == [None, None]
    moved = raw.resolve_nic("ens1")                                # a copy with other keys parses its own
    assert {t: k.host_device for t, k in moved.knob_keys.items()} == {"ens1:gro_flush_timeout": "ens1",
                                                                      "net.core.busy_poll": None}
    assert set(pol.model_copy(update={"knobs": {"vhost:affinity": next(iter(pol.knobs.values()))}})
               .knob_keys) == {"vhost:affinity"}
    assert [pol.model_copy(update={"nic": n}).nic_device for n in ("eth0", "ptb/vb", "{nic}", None, "a/b/c")] \
        == ["eth0", None, None, None, None]
    assert [parse_key(k, placeholder_ok=True).host_device
            for k in ("eth0:threaded", "ptb/vb:threaded", "{nic}:threaded", "net.core.busy_poll")] \
        == ["eth0", None, None, None]


def test_every_kind_declares_grammar_scope_effect_factory_and_catalogue(tmp_path: Path) -> None:
    from polltuned.host.fs import FsHost
    from polltuned.knobs.keys import KINDS
    from polltuned.knobs.registry import KnobRegistry

    reg = KnobRegistry(FsHost(str(tmp_path)), app_cpus=(0,))
    for name, kind in KINDS.items():
        assert kind.name == name and kind.catalogue(), name
        full = kind.catalogue() if kind.head != "DEV" else [f"eth0:{s}" for s in kind.catalogue()]
        for text in full:
            k = parse_key(text)
            assert k.kind == name and k.spec is kind and k.scope == kind.scope
            assert reg.get(text).kind == name                       # the kind's factory built its Knob
            assert reg.key(text) is reg.key(text)                   # the registry parses a text once
    assert parse_key("eth0:irq_affinity").scope == "host-device"
    assert [parse_key(k).file for k in ("net.core.busy_poll", "ns/v:threaded", "module:kvm:halt_poll_ns",
                                        "eth0:napi:defer-hard-irqs")] == [
        "/proc/sys/net/core/busy_poll", "/sys/class/net/ns/v/threaded", "/sys/module/kvm/parameters/halt_poll_ns",
        None]


#: the parser's names: outside knobs/ nobody calls them (DESIGN.md rule 13); the policy's load is the
#: one caller of parse_keys (Policy.knob_keys), everyone else receives KnobKeys
_PARSERS = {"parse_key", "parse_keys", "_parse_device", "parse_module_key"}
_ALLOWED = {("polltuned/policy/schema.py", "parse_keys")}


def test_the_key_parser_is_called_only_inside_knobs() -> None:
    import ast

    found: list[str] = []
    for path in sorted((REPO / "polltuned").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("polltuned/knobs/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.alias):
                name = node.name.rsplit(".", 1)[-1]
            elif isinstance(node, ast.Name):
                name = node.id
            elif isinstance(node, ast.Attribute):
                name = node.attr
                if name == "parse" and isinstance(node.value, ast.Name) and node.value.id == "DeviceRef":
                    found.append(f"{rel}:{node.lineno}: DeviceRef.parse")
            else:
                continue
            if name in _PARSERS and (rel, name) not in _ALLOWED:
                found.append(f"{rel}:{getattr(node, 'lineno', '?')}: {name}")
    assert found == []
    assert len(_ALLOWED) == 1 and "parse_keys" in (REPO / "polltuned/policy/schema.py").read_text()
