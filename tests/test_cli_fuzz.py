"""Fuzz: policy files mutated from the shipped ones, and CLI argument vectors, against a fake tree.

Invariant for every input: the command succeeds, or it prints ``polltuned: error[CODE]: ...``
lines of one code (exactly one line, except ``policy-invalid`` which names every problem on its
own line) plus at most one ``  hint:`` line, exits with that code's exit status, never a
traceback or ``error[internal]`` — and a failed command leaves the fake tree and the journal
byte-for-byte unchanged (a successful ``apply`` is rolled back and must restore every original).

Bounded for CI (derandomized, ~60 examples each, a few seconds); ``POLLTUNED_FUZZ_EXAMPLES=N``
runs a longer campaign.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from polltuned.cli.main import main
from polltuned.clock import FakeClock
from polltuned.errors import ExitCode
from polltuned.host.fs import FsHost
from polltuned.journal import Journal
from polltuned.knobs.registry import KnobRegistry
from tests.test_knobs_faketree import make_tree, tree_values

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "policies").glob("*.toml"))
EXAMPLES = int(os.environ.get("POLLTUNED_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 100, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

#: error code -> the exit status it must come with
EXIT_OF = {"usage": ExitCode.USAGE, "policy-invalid": ExitCode.USAGE, "knob-value": ExitCode.USAGE,
           "knob-unknown": ExitCode.USAGE, "knob-unsupported": ExitCode.UNSUPPORTED,
           "permission": ExitCode.PERMISSION, "locked": ExitCode.LOCKED, "journal-corrupt": ExitCode.JOURNAL,
           "journal-unreadable": ExitCode.JOURNAL, "os-error": ExitCode.FAILURE, "host": ExitCode.FAILURE,
           "policy-needs-editing": ExitCode.USAGE}


def invoke(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)  # must return: an exception escaping main is a failure of the invariant
        except SystemExit as e:  # only argparse's --help, which exits 0 after printing
            assert e.code == 0 and "usage: polltuned" in out.getvalue(), (argv, e.code)
            rc = 0
    return rc, out.getvalue(), err.getvalue()


def check_outcome(rc: int, err: str, what: object) -> str | None:
    """Assert the one-line-error contract; returns the error code (None on success)."""
    assert "Traceback" not in err, (what, err)
    lines = err.splitlines()
    errs = [ln for ln in lines if ln.startswith("polltuned: error[")]
    if rc == 0:
        assert not errs, (what, err)
        return None
    hints = [ln for ln in lines if ln.startswith("  hint: ")]
    assert errs and len(hints) <= 1 and len(errs) + len(hints) == len(lines), (what, rc, err)
    codes = {ln.split("]", 1)[0].removeprefix("polltuned: error[") for ln in errs}
    assert len(codes) == 1, (what, err)
    code = codes.pop()
    assert code != "internal", (what, err)
    assert len(errs) == 1 or code == "policy-invalid", (what, err)
    assert code in EXIT_OF and rc == int(EXIT_OF[code]), (what, rc, err)
    return code


# -- policy documents ----------------------------------------------------------------------------

def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=False)} = {toml_value(x)}"
                               for k, x in v.items()) + "}"
    raise TypeError(type(v))


def to_toml(doc: dict[str, Any]) -> str:
    """Every top-level key on its own line; tables as inline tables (valid TOML 1.0)."""
    return "".join(f"{json.dumps(str(k), ensure_ascii=False)} = {toml_value(v)}\n" for k, v in doc.items())


TEXT = hs.text(alphabet=hs.characters(exclude_categories=["Cs"]), max_size=12)
WEIRD: hs.SearchStrategy[Any] = hs.one_of(
    hs.integers(min_value=-(2**70), max_value=2**70),
    hs.sampled_from([0, -1, 2**31, 2**63, 10**30, -(10**30)]),
    hs.floats(allow_nan=True, allow_infinity=True),
    hs.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308, -0.0, 5e-324]),
    TEXT, hs.sampled_from(["", "²", "٣", "５", "\u202e", "eth0\n", "{nic}", "../../etc", "\x00", "☃" * 50]),
    hs.booleans(), hs.lists(hs.integers(-5, 5), max_size=3), hs.builds(dict), hs.fixed_dictionaries({"x": TEXT}),
)


def paths(doc: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*prefix, k))
            out.extend(paths(v, (*prefix, k)))
    return out


def apply_mutation(doc: dict[str, Any], path: tuple[str, ...], op: str, value: Any, newkey: str) -> None:
    parent: Any = doc
    for k in path[:-1]:
        parent = parent[k]
    last = path[-1]
    if op == "delete":
        del parent[last]
    elif op == "retype":
        parent[last] = copy.deepcopy(value)
    elif op == "add":
        (parent[last] if isinstance(parent[last], dict) else parent)[newkey] = copy.deepcopy(value)
    elif op == "rename":
        parent[newkey] = parent.pop(last)


@hs.composite
def policy_texts(draw: hs.DrawFn) -> bytes:
    src = draw(hs.sampled_from(SHIPPED))
    doc = tomllib.loads(src.read_text())
    doc.pop("include", None)
    for _ in range(draw(hs.integers(0, 3))):
        ps = paths(doc)
        if not ps:
            break
        apply_mutation(doc, draw(hs.sampled_from(ps)), draw(hs.sampled_from(["delete", "retype", "add", "rename"])),
                       draw(WEIRD), draw(hs.one_of(TEXT.filter(bool), hs.sampled_from(["min", "max", "kind"]))))
    text = to_toml(doc).encode()
    lines = text.split(b"\n")
    kind = draw(hs.sampled_from(["plain", "plain", "duplicate-line", "bytes"]))
    if kind == "duplicate-line" and lines:
        i = draw(hs.integers(0, len(lines) - 1))
        lines.insert(i, lines[i])
        text = b"\n".join(lines)
    elif kind == "bytes":
        pos = draw(hs.integers(0, len(text)))
        text = text[:pos] + draw(hs.binary(min_size=1, max_size=4)) + text[pos:]
    return text


def test_fuzz_policy_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # whatever a fuzzed command might write lands here
    root = make_tree(tmp_path / "root")
    originals = tree_values(root)
    seen: dict[str | None, int] = {}

    @FUZZ
    @given(policy_texts(), hs.sampled_from(["check", "check-json"]))
    def one(text: bytes, how: str) -> None:
        p = tmp_path / "fuzzed.toml"
        p.write_bytes(text)
        argv = ["--host-root", str(root), "--state-dir", str(tmp_path / "st"), "check", str(p), "--nic", "eth0"]
        rc, _, err = invoke(argv + (["--json"] if how == "check-json" else []))
        code = check_outcome(rc, err, text)
        seen[code] = seen.get(code, 0) + 1
        assert tree_values(root) == originals

    one()
    print(f"policy fuzz: {sum(seen.values())} documents, outcomes {seen}")
    # the campaign reached both sides of the contract
    assert seen.get("policy-invalid", 0) > 0 and sum(seen.values()) >= min(EXAMPLES, 20), seen


def test_shipped_policies_pass_the_same_contract(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "root")
    for p in SHIPPED:
        rc, _, err = invoke(["--host-root", str(root), "check", str(p), "--nic", "eth0"])
        # this fake tree has no /proc/stat: a policy whose objective needs CPU must say what to edit
        assert check_outcome(rc, err, p) in (None, "knob-unsupported", "policy-needs-editing"), (p, err)


# -- CLI argument vectors ------------------------------------------------------------------------

KEYS = ["net.core.busy_poll", "net.core.busy_read", "eth0:gro_flush_timeout", "eth0:irq_affinity",
        "eth0:napi:defer-hard-irqs", "module:kvm:halt_poll_ns", "eth9:threaded", "kernel.timer_migration",
        "net.core.netdev_budget_usecs", "", "ptb/vb:napi_defer_hard_irqs", "module:x", "../../x:y", "n\u00e9t"]
VALUES = ["0", "50", "-1", "²", "٣", "", "9" * 40, "1e3", "inf", "nan", "spread", "pack-app", " 7 ", "0x1", "+3",
          "2147483647", "2147483648", "\u202e5", "5\n"]
FREE = ["0-1", "1", "x", "²", "eth0", "sim-default", "latency-critical", "bench", "", "-", "99999999999999999999",
        "☃", "/nonexistent/policy.toml", "1,,2", "0-", "eth0\n", "٣"]
JUNK = ["--frob", "--", "-h", "--json=1", "--host-root", "status", "=", "--dry-run=yes"]
#: command -> (flags, options taking a value)
GRAMMAR: dict[str, tuple[list[str], list[str]]] = {
    "apply": (["--dry-run", "--json"], ["--reason", "--app-cpus"]),
    "check": (["--json"], ["--nic", "--app-cpus"]),
    "status": (["--json"], []),
    "verify": (["--json"], []),
    "rollback": (["--if-dirty", "--json"], []),
    "history": (["--all", "--json"], ["--policy", "--config", "--nic", "--session"]),
    "bench": (["--json", "--cleanup", "--no-lock"], ["--workload", "--budget", "--window", "--rounds", "--seed"]),
    "man": ([], []),
}


@hs.composite
def argvs(draw: hs.DrawFn, root: Path, state: Path, run: Path) -> list[str]:
    g = ["--host-root", draw(hs.sampled_from([str(root), str(root), str(state.parent / "no-such-root")])),
         "--state-dir", draw(hs.sampled_from([str(state)] * 4 + [str(state.parent / "a-file")])),
         "--run-dir", str(run)]
    cmd = draw(hs.sampled_from(["apply", "apply", "apply", "check", "status", "verify", "rollback", "rollback",
                                "history", "bench", "man"]))
    flags, valued = GRAMMAR[cmd]
    groups: list[list[str]] = []  # option + value stay together; the groups come in any order
    if cmd == "apply":
        for _ in range(draw(hs.integers(1, 4))):
            sep = draw(hs.sampled_from(["="] * 6 + ["", "=="]))
            groups.append([draw(hs.sampled_from(KEYS)) + sep + draw(hs.one_of(hs.sampled_from(VALUES), TEXT))])
    if cmd == "check" and draw(hs.booleans()):
        groups.append([draw(hs.sampled_from(FREE))])
    for f in flags:
        if draw(hs.integers(0, 3)) == 0:
            groups.append([f])
    for o in valued:
        if draw(hs.integers(0, 2)) == 0:
            groups.append([o, draw(hs.one_of(hs.sampled_from(FREE + VALUES), TEXT))])
    if draw(hs.integers(0, 6)) == 0:
        groups.insert(draw(hs.integers(0, len(groups))), [draw(hs.one_of(hs.sampled_from(JUNK), TEXT))])
    toks = [t for grp in draw(hs.permutations(groups)) for t in grp]
    return [*g, cmd, *toks]


def test_fuzz_cli_argument_vectors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each vector starts from the fixture tree and a fresh state directory, or (drawn) one where a
    valid apply left polltuned values: then ``status`` may answer 3 (dirty), which is a result,
    not an error. Every example is independent, so a failure shrinks to itself."""
    from polltuned.actuator import Actuator

    monkeypatch.chdir(tmp_path)  # whatever a fuzzed command might write lands here
    root = make_tree(tmp_path / "root")
    originals = tree_values(root)
    state, run = tmp_path / "st", tmp_path / "run"
    (tmp_path / "a-file").write_text("not a directory\n")
    outcomes: dict[str | None, int] = {}

    def journal_bytes() -> bytes | None:
        p = state / "journal.jsonl"
        return p.read_bytes() if p.exists() else None

    def actuator() -> Actuator:
        host = FsHost(root)
        return Actuator(host, Journal(state, clock=FakeClock()), registry=KnobRegistry(host, app_cpus=[1]),
                        clock=FakeClock())

    @FUZZ
    @given(argvs(root, state, run), hs.booleans())
    def one(argv: list[str], dirty_first: bool) -> None:
        shutil.rmtree(state, ignore_errors=True)
        assert tree_values(root) == originals  # the previous example cleaned up
        if dirty_first:
            actuator().apply({"net.core.busy_poll": 50, "eth0:gro_flush_timeout": 1000})
        before_tree, before_journal = tree_values(root), journal_bytes()
        rc, _, err = invoke(argv)
        is_status = argv[argv.index("--run-dir") + 2] == "status"
        if is_status and rc == int(ExitCode.DIRTY):  # a result: "not running, host dirty"
            assert dirty_first and "polltuned: error[" not in err, (argv, err)
            rc = 0
        code = check_outcome(rc, err, argv)
        outcomes[code] = outcomes.get(code, 0) + 1
        if code is not None:  # failed: nothing changed
            assert tree_values(root) == before_tree, argv
            assert journal_bytes() == before_journal, argv
        if tree_values(root) != originals:  # an apply left values (or the prelude did): rollback restores
            assert actuator().rollback().ok, argv
        assert tree_values(root) == originals, argv

    one()
    print(f"CLI fuzz: {sum(outcomes.values())} argument vectors, outcomes {outcomes}")
    assert outcomes.get(None, 0) > 0 and len(outcomes) >= 3, outcomes
