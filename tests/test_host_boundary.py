"""House rule 1: only polltuned/host/ touches the kernel.

Scans every module outside ``polltuned/host/`` (AST, not grep, so comments and docstrings do not
count) for: imports of subprocess / socket / pyroute2 / psutil / fcntl / ctypes, and calls of
``open``, ``os.open``, ``io.open`` or ``Path``/``PurePath`` whose first argument is a literal
(or f-string) starting with /proc, /sys or /dev. The allow-list must name the file, the thing
and why.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "polltuned"
FORBIDDEN_IMPORTS = {"subprocess", "socket", "pyroute2", "psutil", "fcntl", "ctypes"}
#: ``host.read_text("/proc/..")`` is the sanctioned door; pathlib reads are caught at ``Path("/proc..")``
OPENERS = {"open", "Path", "PurePath"}
SYSTEM = ("/proc", "/sys", "/dev")

#: (path relative to polltuned/, forbidden thing) -> why it is acceptable
ALLOW: dict[tuple[str, str], str] = {
    # advisory lock files in the run/state dirs (flock is not a kernel tunable or counter)
    ("journal.py", "fcntl"): "flock on the journal's own lock file",
    ("cli/bench.py", "fcntl"): "flock on /tmp/polltuned-realkernel.lock shared with the tests",
    ("daemon/status.py", "fcntl"): "flock on the daemon's status/lock file in --run-dir",
}


def _literal_prefix(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def _violations(path: Path) -> list[tuple[str, str]]:
    rel = path.relative_to(PKG).as_posix()
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top in FORBIDDEN_IMPORTS:
                    found.append((top, f"{rel}:{node.lineno}: import {a.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top in FORBIDDEN_IMPORTS:
                found.append((top, f"{rel}:{node.lineno}: from {node.module} import ..."))
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in OPENERS and node.args:
                lit = _literal_prefix(node.args[0])
                if lit is not None and lit.startswith(SYSTEM):
                    found.append(("system-path", f"{rel}:{node.lineno}: {name}({lit!r}...)"))
    return [(thing, where) for thing, where in found if (rel, thing) not in ALLOW]


def test_only_host_layer_touches_the_kernel() -> None:
    files = [p for p in PKG.rglob("*.py") if "host" not in p.relative_to(PKG).parts[:1]]
    assert len(files) > 10
    problems = [where for p in files for _, where in _violations(p)]
    assert problems == [], "kernel access outside polltuned/host/:\n" + "\n".join(problems)


def test_scanner_catches_violations(tmp_path: Path) -> None:
    bad = PKG / "counters" / "_boundary_probe_tmp.py"
    bad.write_text('import psutil\nfrom pyroute2 import IPRoute\nopen("/proc/stat")\n'
                   'from pathlib import Path\nPath(f"/sys/class/net/{x}").read_text()\n')
    try:
        got = sorted(t for t, _ in _violations(bad))
    finally:
        bad.unlink()
    assert got == ["psutil", "pyroute2", "system-path", "system-path"]
