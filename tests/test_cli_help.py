"""The CLI a sysadmin expects: ``--help`` lists every command with its one line, every option of
every command has help, the man page generated from the parser names every command and option and
is installed by config/install.sh, and ``apply --dry-run`` shows the transaction without writing."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from polltuned.cli.main import COMMANDS, build_parser, main
from polltuned.cli.man import render
from polltuned.errors import ExitCode
from tests.test_knobs_faketree import make_tree, tree_values

REPO = Path(__file__).resolve().parents[1]


def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def test_help_lists_every_command_with_its_summary(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main(["--help"])
    assert ei.value.code == 0
    out = re.sub(r"\s+", "", capsys.readouterr().out)  # argparse wraps lines (also at hyphens)
    for name, (_, summary) in COMMANDS.items():
        assert re.sub(r"\s+", "", name + summary) in out, (name, summary)
    assert set(subparsers(build_parser())) == set(COMMANDS)


def test_every_option_of_every_command_has_help() -> None:
    p = build_parser(full=True)
    missing = [f"polltuned {a.dest}" for a in options(p) if not a.help or a.help == argparse.SUPPRESS]
    for name, sp in subparsers(p).items():
        assert sp.description, name
        for a in options(sp):
            if not a.help or a.help == argparse.SUPPRESS or len(a.help) < 8:
                missing.append(f"polltuned {name} {'/'.join(a.option_strings) or a.dest}")
    assert missing == []
    assert len(subparsers(p)) == len(COMMANDS) >= 12


def test_summary_is_the_subcommand_help(capsys: pytest.CaptureFixture[str]) -> None:
    for name, (_, summary) in COMMANDS.items():
        with pytest.raises(SystemExit):
            main([name, "--help"])
        out = re.sub(r"\s+", "", capsys.readouterr().out)
        assert re.sub(r"\s+", "", summary) in out, name


def test_man_page_mentions_every_command_and_option() -> None:
    p = build_parser(full=True)
    page = render(p)
    assert page.startswith(".TH POLLTUNED 8 ")
    text = page.replace("\\-", "-").replace("\\fB", "").replace("\\fI", "").replace("\\fR", "").replace("\\&", "")
    for a in options(p):
        for o in a.option_strings:
            assert o in text, o
    for name, sp in subparsers(p).items():
        assert f'.SS "{name}"' in page
        section = text.split(f'.SS "{name}"', 1)[1].split(".SS ", 1)[0]
        assert COMMANDS[name][1] in section
        for a in options(sp):
            assert (a.option_strings[-1] if a.option_strings else str(a.metavar or a.dest)) in section, (name, a)
    for code in ExitCode:
        assert f"B{int(code)}" in page.replace("\\f", "")
    assert "journal.baselines.json" in text
    assert all(ord(c) < 128 for c in page)  # non-ASCII is escaped as \[uXXXX]


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff not installed")
def test_man_page_renders_without_warnings(tmp_path: Path) -> None:
    page = tmp_path / "polltuned.8"
    r = subprocess.run([sys.executable, "-m", "polltuned", "man", "--output", str(page)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == ""
    g = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(page)], capture_output=True, text=True, timeout=60)
    assert g.returncode == 0 and g.stderr == "", g.stderr
    shown = subprocess.run(["groff", "-man", "-Tascii", str(page)], capture_output=True, text=True, timeout=60).stdout
    plain = re.sub(r".\x08", "", shown)
    assert "--dry-run" in plain and "rollback" in plain and "EXIT STATUS" in plain


def test_install_script_installs_the_generated_man_page() -> None:
    text = (REPO / "config/install.sh").read_text()
    # the system set-up (also run by the system install after pip) installs it
    system = text.split("setup_system() {", 1)[1].split("\n}\n", 1)[0]
    assert 'setup_system "$venv"' in text.split('if [ "$mode" = dev ]; then', 1)[1]
    assert 'mandir=/usr/local/share/man/man8' in system
    assert '"$venv/bin/polltuned" man --output "$mandir/polltuned.8.tmp"' in system
    assert 'mv -f "$mandir/polltuned.8.tmp" "$mandir/polltuned.8"' in system
    assert subprocess.run(["bash", "-n", str(REPO / "config/install.sh")]).returncode == 0


# -- apply --dry-run ------------------------------------------------------------------------------

def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
            h.update(oct(p.stat().st_mode).encode())
    return h.hexdigest()


def test_apply_dry_run_writes_nothing_and_shows_the_transaction(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    root = make_tree(tmp_path / "root")
    st = tmp_path / "st"
    g = ["--host-root", str(root), "--state-dir", str(st)]
    kv = ["net.core.busy_poll=50", "eth0:gro_flush_timeout=20000"]
    h0 = tree_hash(root)
    assert main([*g, "apply", "--dry-run", *kv]) == 0
    out = capsys.readouterr().out
    assert tree_hash(root) == h0 and not st.exists()  # nothing written, not even the state directory
    assert "dry run: nothing written" in out
    for line in ["  epoch     1", "  txn       1 (manual): net.core.busy_poll, eth0:gro_flush_timeout",
                 "  baseline  net.core.busy_poll = 0", "  baseline  eth0:gro_flush_timeout = 0",
                 "  intent    net.core.busy_poll = 50", "  applied   eth0:gro_flush_timeout = 20000",
                 "net.core.busy_poll: 0 -> 50"]:
        assert line in out, line
    # the plan is exactly what apply then journals (record types, keys, values, order)
    assert main([*g, "apply", "--dry-run", "--json", "--reason", "r1", *kv]) == 0
    plan = json.loads(capsys.readouterr().out)["records"]
    assert tree_hash(root) == h0 and not st.exists()
    assert main([*g, "apply", "--reason", "r1", *kv]) == 0
    capsys.readouterr()
    journaled = [json.loads(ln) for ln in (st / "journal.jsonl").read_text().splitlines()]
    strip = {"v", "seq", "t", "crc"}
    assert [{k: v for k, v in r.items() if k not in strip} for r in journaled] == plan
    # a second dry run on the open epoch: no new epoch, no baseline for a known knob, journal unchanged
    jbytes = (st / "journal.jsonl").read_bytes()
    copy = (st / "journal.baselines.json").read_bytes()
    h1 = tree_hash(root)
    (root / "sys/class/net/eth0/gro_flush_timeout").write_text("7\n")  # the admin: released in the plan
    h1 = tree_hash(root)
    assert main([*g, "apply", "--dry-run", "--json", "net.core.busy_poll=60", "net.core.busy_read=5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    types = [r["type"] for r in doc["records"]]
    assert types == ["released", "txn", "baseline", "intent", "applied", "intent", "applied", "txn-end"]
    assert doc["released_now"] == ["eth0:gro_flush_timeout"]
    assert [r["key"] for r in doc["records"] if r["type"] == "baseline"] == ["net.core.busy_read"]
    assert (st / "journal.jsonl").read_bytes() == jbytes and (st / "journal.baselines.json").read_bytes() == copy
    assert tree_hash(root) == h1
    originals = tree_values(make_tree(tmp_path / "fresh"))
    assert main([*g, "rollback"]) == 0
    capsys.readouterr()
    now = tree_values(root)
    assert now["sys/class/net/eth0/gro_flush_timeout"] == "7\n"  # the admin's value stays
    assert {k: v for k, v in now.items() if "gro_flush" not in k} == \
        {k: v for k, v in originals.items() if "gro_flush" not in k}


def test_apply_dry_run_refuses_what_apply_would(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_tree(tmp_path / "root")
    st = tmp_path / "st"
    g = ["--host-root", str(root), "--state-dir", str(st)]
    h0 = tree_hash(root)
    assert main([*g, "apply", "--dry-run", "module:kvm:halt_poll_ns=5"]) == 4  # read-only
    assert "error[knob-unsupported]" in capsys.readouterr().err
    assert main([*g, "apply", "net.core.busy_poll=50"]) == 0
    (st / "journal.jsonl").write_bytes(b"")  # damaged: the dry run says so, like apply would
    assert main([*g, "apply", "--dry-run", "net.core.busy_poll=5"]) == 7
    assert "error[journal-corrupt]" in capsys.readouterr().err
    assert tree_hash(root) != h0 and (root / "proc/sys/net/core/busy_poll").read_text() == "50\n"
