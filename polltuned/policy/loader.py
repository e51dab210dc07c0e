"""TOML policy loading with includes, turning pydantic errors into one line per problem."""

from __future__ import annotations

import errno as errno_mod
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from polltuned.errors import PermissionNeeded, PolicyError
from polltuned.knobs.keys import key_problems
from polltuned.policy.schema import Policy
from polltuned.trust import require_trusted

_MAX_INCLUDE_DEPTH = 8


def policy_search_path() -> list[Path]:
    """Where a bare policy name (``latency-critical``) is looked up, in order."""
    env = os.environ.get("POLLTUNED_POLICY_PATH")
    dirs = [Path(p) for p in env.split(":") if p] if env else []
    dirs += [Path("/etc/polltuned/policies"), Path("/usr/share/polltuned/policies")]
    dirs.append(Path(__file__).resolve().parents[2] / "policies")  # a source checkout
    return dirs


def _not_a_file(name: str, p: Path, what: str = "policy") -> PolicyError:
    """Why ``p`` is not a readable file, in words: missing, a directory, a symlink loop, ..."""
    try:
        st = p.stat()
    except FileNotFoundError:
        return PolicyError([f"{name}: no such {what} file"])
    except OSError as e:
        return PolicyError([f"{name}: cannot open the {what} file: {e.strerror or e}"
                            + (" (a symlink loop)" if e.errno == errno_mod.ELOOP else "")])
    import stat as stat_mod

    return PolicyError([f"{name}: is a directory, not a {what} file" if stat_mod.S_ISDIR(st.st_mode)
                        else f"{name}: not a regular file"])


def find_policy(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" or os.sep in name_or_path:
        if not p.is_file():
            raise _not_a_file(name_or_path, p)
        return p
    for d in policy_search_path():
        cand = d / f"{name_or_path}.toml"
        if cand.is_file():
            return cand
    raise PolicyError(
        [f"{name_or_path}: no policy of that name"],
        hint="searched " + ", ".join(str(d) for d in policy_search_path()),
    )


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict) and k != "probe":
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def read_toml(path: Path, what: str = "config") -> dict[str, Any]:
    """One TOML file; unreadable or malformed -> PolicyError naming the file; as root, a file
    someone else can change -> UntrustedFile (exit 5, polltuned.trust); unreadable by this user ->
    PermissionNeeded (exit 5)."""
    require_trusted(path, what)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        if e.errno in (errno_mod.EACCES, errno_mod.EPERM):
            raise PermissionNeeded(f"{path}: cannot read the {what} file: {e.strerror or e}",
                                   hint="run polltuned as root, or make the file readable") from e
        if isinstance(e, (IsADirectoryError, FileNotFoundError)) or e.errno == errno_mod.ELOOP:
            raise _not_a_file(str(path), path, what) from e
        raise PolicyError([f"{path}: cannot read: {e.strerror or e}"]) from e
    except UnicodeDecodeError as e:
        raise PolicyError([f"{path}: not UTF-8 text: byte 0x{e.object[e.start]:02x} at offset {e.start}"]) from None
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise PolicyError([f"{path}: not valid TOML: nested too deeply"]) from None
    except tomllib.TOMLDecodeError as e:
        raise PolicyError([f"{path}: not valid TOML: {e}"]) from e


def _read_toml(path: Path, depth: int, seen: tuple[Path, ...]) -> dict[str, Any]:
    if depth > _MAX_INCLUDE_DEPTH:
        raise PolicyError([f"{path}: include: nested deeper than {_MAX_INCLUDE_DEPTH} levels"])
    rp = path.resolve()
    if rp in seen:
        raise PolicyError([f"{path}: include: cycle through {rp}"])
    data = read_toml(path, "include" if depth else "policy")
    includes = data.get("include", [])
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise PolicyError([f"{path}: include: must be a list of file names (got {includes!r})"])
    merged: dict[str, Any] = {}
    for inc in includes:
        ip = (path.parent / inc) if not os.path.isabs(inc) else Path(inc)
        if not ip.is_file():
            raise PolicyError([f"{path}: include: no such file {inc!r}"])
        merged = _merge(merged, _read_toml(ip, depth + 1, (*seen, rp)))
    merged = _merge(merged, {k: v for k, v in data.items() if k != "include"})
    return merged


def format_validation_error(source: str, err: ValidationError, data: Mapping[str, Any] | None = None) -> list[str]:
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"] if not (isinstance(x, str) and x in _UNION_TAGS))
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (not allowed here)"
        elif e["type"] == "missing":
            got = None
        suffix = "" if got is None or isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"{source}: {loc or '<top>'}: {msg}{suffix}")
    return lines


_UNION_TAGS = {"sockperf", "tcp_rtt", "prometheus", "command", "sim"}


def knob_key_problems(source: str, keys: list[str]) -> list[str]:
    """One line per knob key that is not in the catalogue (polltuned.knobs.keys): file, field,
    value, the rule it breaks and the closest known key."""
    return [f"{source}: knobs.{key}: {e.rule} (got {key!r})"
            + (f"; did you mean {e.suggestion}?" if e.suggestion else "")
            for key, e in key_problems(keys, placeholder_ok=True)]


def policy_from_dict(data: Mapping[str, Any], source: str = "<policy>") -> Policy:
    try:
        pol = Policy.model_validate(dict(data))
    except ValidationError as e:
        raise PolicyError(format_validation_error(source, e, data)) from None
    problems = knob_key_problems(source, list(pol.knobs))
    if problems:
        raise PolicyError(problems)
    return pol


def load_policy(name_or_path: str, nic: str | None = None) -> Policy:
    """Load, merge includes, validate and resolve ``{nic}``. Raises PolicyError (exit 2)."""
    path = find_policy(name_or_path)
    data = _read_toml(path, 0, ())
    pol = policy_from_dict(data, str(path))
    try:
        resolved = pol.resolve_nic(nic)
    except ValueError as e:
        raise PolicyError([f"{path}: nic: {e}"]) from None
    bad = key_problems([k for k in resolved.knobs if k not in pol.knobs], placeholder_ok=False)
    if bad:
        raise PolicyError([f"{path}: nic: {bad[0][1].rule} (got {resolved.nic!r})"])
    return resolved
