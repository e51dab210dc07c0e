"""Issue 16: a fuzz campaign over state-directory damage (not only policies and CLI vectors).

After 1-3 applies (sometimes across a rollback: several epochs), the state directory is damaged:
the journal truncated at every record boundary and inside every record, byte flips, deletions,
the journal and its copy damaged together, directories and symlinks in their place. The oracle:

* before any rollback, ``health()`` is never "clean" while a knob is off its original;
* after ``rollback`` no original is lost when the copy or the journal survived intact, and the
  host is never reported "clean" while a knob is off its original (when both records are gone the
  rollback fails and the state stays unknown — it never claims clean).

The default run takes every CASE_STRIDE-th case (a quick subset); ``POLLTUNED_FUZZ_FULL=1`` runs
the whole campaign (the count is printed and asserted >= 500). A full disk is its own test on a
small tmpfs (root only).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from polltuned.actuator import JournalRecovered
from polltuned.errors import ExitCode, JournalError, PolltunedError
from polltuned.journal import COPY_NAME, JOURNAL_NAME
from tests.test_crash_rollback import actuator, fast_dir, random_assignment
from tests.test_knobs_faketree import make_tree, tree_values

__all__ = ["fast_dir"]  # the fixture, re-exported for pytest

BP = "proc/sys/net/core/busy_poll"
BR = "proc/sys/net/core/busy_read"
FULL = os.environ.get("POLLTUNED_FUZZ_FULL") == "1"
CASE_STRIDE = 1 if FULL else 6


@dataclass(frozen=True)
class Damage:
    name: str
    #: which record survives intact: "copy", "journal" or "" (both damaged)
    intact: str
    apply: Callable[[Path], None]


def _cut(n: int) -> Callable[[Path], None]:
    def f(st: Path) -> None:
        jp = st / JOURNAL_NAME
        jp.write_bytes(jp.read_bytes()[:n])
    return f


def _flip(name: str, pos: int, bit: int) -> Callable[[Path], None]:
    def f(st: Path) -> None:
        p = st / name
        data = bytearray(p.read_bytes())
        if data:
            data[pos % len(data)] ^= 1 << bit
        p.write_bytes(bytes(data))
    return f


def _replace(name: str, how: str) -> Callable[[Path], None]:
    def f(st: Path) -> None:
        p = st / name
        if p.exists() or p.is_symlink():
            p.unlink()
        if how == "delete":
            return
        if how == "empty":
            p.write_bytes(b"")
        elif how == "dir":
            p.mkdir()
        elif how == "symlink-loop":
            p.symlink_to(p.name)
        elif how == "symlink-missing":
            p.symlink_to(st / "nowhere" / "x")
        elif how == "symlink-dir":
            p.symlink_to(st)
    return f


def _both(*fs: Callable[[Path], None]) -> Callable[[Path], None]:
    def f(st: Path) -> None:
        for g in fs:
            g(st)
    return f


def damages(journal: bytes, copy: bytes, rng: random.Random) -> list[Damage]:
    out: list[Damage] = []
    ends = [i + 1 for i, b in enumerate(journal) if b == 0x0A]
    starts = [0, *ends[:-1]]
    for e in [0, *ends[:-1]]:                      # every record boundary (the full length is no damage)
        out.append(Damage(f"cut@{e}", "copy", _cut(e)))
    for s, e in zip(starts, ends, strict=True):   # inside every record
        out.append(Damage(f"cut-in@{s}", "copy", _cut(rng.randint(s + 1, e - 1))))
    for _ in range(max(20, len(journal) // 400)):
        pos, bit = rng.randrange(len(journal)), rng.randrange(8)
        out.append(Damage(f"flip-journal@{pos}.{bit}", "copy", _flip(JOURNAL_NAME, pos, bit)))
    for _ in range(6):
        pos, bit = rng.randrange(len(copy)), rng.randrange(8)
        out.append(Damage(f"flip-copy@{pos}.{bit}", "journal", _flip(COPY_NAME, pos, bit)))
    for how in ("delete", "empty", "dir", "symlink-loop", "symlink-missing", "symlink-dir"):
        out.append(Damage(f"journal-{how}", "copy", _replace(JOURNAL_NAME, how)))
        out.append(Damage(f"copy-{how}", "journal", _replace(COPY_NAME, how)))
    for how in ("delete", "empty", "dir", "symlink-loop"):   # both damaged together
        for e in rng.sample([0, *ends[:-1]], min(3, len(ends))):
            out.append(Damage(f"cut@{e}+copy-{how}", "", _both(_cut(e), _replace(COPY_NAME, how))))
        out.append(Damage(f"journal-empty+copy-{how}", "", _both(_replace(JOURNAL_NAME, "empty"),
                                                                 _replace(COPY_NAME, how))))
        pos, bit = rng.randrange(len(journal)), rng.randrange(8)
        out.append(Damage(f"flip-journal@{pos}+copy-{how}", "", _both(_flip(JOURNAL_NAME, pos, bit),
                                                                      _replace(COPY_NAME, how))))
    return out


@dataclass
class Tally:
    cases: int = 0
    lost: int = 0          # an original not restored although a record of it survived intact
    false_clean: int = 0   # "clean" while a knob is off its original
    from_copy: int = 0
    unknown: int = 0       # both records damaged: the rollback said so (state unknown)


def _health_state(root: Path, st: Path) -> str:
    try:
        return actuator(root, st).health().state
    except PolltunedError as e:
        return f"error:{e.code}"


def run_case(root: Path, st: Path, originals: dict[str, str], d: Damage, t: Tally) -> None:
    d.apply(st)
    t.cases += 1
    tuned = tree_values(root) != originals
    if tuned and _health_state(root, st) == "clean":
        t.false_clean += 1
        pytest.fail(f"{d.name}: clean before the rollback while knobs are tuned")
    failed = False
    try:
        rep = actuator(root, st).rollback()
        failed = rep.problem is not None or not rep.ok
    except JournalRecovered as e:
        t.from_copy += 1
        failed = not e.report.clean
    except JournalError:
        failed = True
    off = {k: (originals[k], v) for k, v in tree_values(root).items() if v != originals[k]}
    if off and d.intact:
        t.lost += 1
        pytest.fail(f"{d.name}: originals lost although the {d.intact} is intact: {off}")
    if off and not failed:
        t.lost += 1
        pytest.fail(f"{d.name}: rollback succeeded but left {off}")
    after = _health_state(root, st)
    if off and after == "clean":
        t.false_clean += 1
        pytest.fail(f"{d.name}: clean after the rollback while {off} are off")
    t.unknown += bool(off)


def _scenarios(rng: random.Random) -> Iterator[list[list[dict[str, object]]]]:
    """Apply plans: a list of epochs (a rollback between them), each a list of assignments."""
    yield [[random_assignment(rng)]]
    yield [[random_assignment(rng) for _ in range(3)]]
    yield [[random_assignment(rng)], [random_assignment(rng), random_assignment(rng)]]
    yield [[random_assignment(rng) for _ in range(2)]]
    yield [[random_assignment(rng)], [random_assignment(rng)], [random_assignment(rng)]]


def test_state_directory_damage_campaign(fast_dir: Path) -> None:
    rng = random.Random(1616)
    root = make_tree(fast_dir / "root")
    originals = tree_values(root)
    t = Tally()
    n = 0
    for si, plan in enumerate(_scenarios(rng)):
        base = fast_dir / f"base{si}"
        act = actuator(root, base)
        for ei, epoch in enumerate(plan):
            if ei:
                act.rollback()
            for a in epoch:
                act.apply(a, reason="fuzz")
        tuned = tree_values(root)
        journal, copy = (base / JOURNAL_NAME).read_bytes(), (base / COPY_NAME).read_bytes()
        for d in damages(journal, copy, rng):
            n += 1
            if n % CASE_STRIDE:
                continue
            for rel, text in tuned.items():  # back to the tuned host and the undamaged state
                if (root / rel).read_text() != text:
                    (root / rel).write_text(text)
            st = fast_dir / "st"
            shutil.rmtree(st, ignore_errors=True)
            shutil.copytree(base, st, symlinks=True)
            run_case(root, st, originals, d, t)
        for rel, text in originals.items():
            (root / rel).write_text(text)
    print(f"state damage campaign: {t.cases} cases ({n} generated), {t.from_copy} restored from the copy, "
          f"{t.unknown} left unknown (both records damaged), {t.lost} originals lost, {t.false_clean} false clean")
    assert t.lost == 0 and t.false_clean == 0
    assert t.cases >= (500 if FULL else 80)


# -- a full disk ------------------------------------------------------------------------------------

@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "full"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "polltuned-test", str(mnt)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def _fill(d: Path) -> Path:
    filler = d / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler


def test_full_disk_apply_refused_and_rollback_still_restores(small_tmpfs: Path, tmp_path: Path) -> None:
    """Disk full: apply fails with state-not-writable (exit 7) and leaves the knobs as they were;
    rollback still restores every knob, says the journal could not record it, and completes once
    space is free."""
    root = make_tree(tmp_path / "root")
    originals = tree_values(root)
    st = small_tmpfs / "state"
    act = actuator(root, st)
    act.apply({"net.core.busy_poll": 50, "net.core.busy_read": 25, "net.core.gro_normal_batch": 16})
    act.apply({"net.core.busy_poll": 70, "kernel.timer_migration": 0})
    filler = _fill(small_tmpfs)
    # the journal's last page may still take a few records: apply until the journal is full; every
    # apply either succeeds (and is journaled) or fails with state-not-writable leaving the knobs
    refused = 0
    for i in range(200):
        before = tree_values(root)
        want = {BP: f"{1 + i % 7}\n", BR: f"{2 + i % 5}\n"}
        try:
            actuator(root, st).apply({"net.core.busy_poll": 1 + i % 7, "net.core.busy_read": 2 + i % 5})
        except JournalError as e:
            assert e.code == "state-not-writable" and e.exit_code == ExitCode.JOURNAL, e
            # nothing written, or written and journaled with only the transaction's end missing
            now = tree_values(root)
            assert now == before or (now == {**before, **want} and "written and journaled" in e.message), e
            refused += 1
            if refused >= 3:
                break
    assert refused >= 3
    rep = actuator(root, st).rollback()
    assert tree_values(root) == originals, rep
    assert rep.problem is not None and rep.problem.code == "state-not-writable" and not rep.clean
    assert actuator(root, st).health().state != "clean" or tree_values(root) == originals
    filler.unlink()
    rep = actuator(root, st).rollback()
    assert rep.problem is None and rep.clean and actuator(root, st).health().state == "clean"
    assert tree_values(root) == originals
