"""Shared helpers for the pure counter parsers (no I/O)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from polltuned.errors import ParseError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


def uints(tokens: list[str], path: str, lineno: int, what: str) -> list[int]:
    """Decimal unsigned integers, strictly ASCII ``[0-9]+`` (``int()`` alone would accept
    ``+1``, ``1_0`` and non-ASCII digits, which no kernel file prints)."""
    joined = "".join(tokens)
    if not tokens or not (joined.isascii() and joined.isdigit()) or "" in tokens:
        bad = next((t for t in tokens if not (t.isascii() and t.isdigit())), "")
        raise ParseError(path, lineno, f"{what}: expected unsigned decimal integers, got {bad[:40]!r}")
    return list(map(int, tokens))


def uint(token: str, path: str, lineno: int, what: str) -> int:
    if not (token.isascii() and token.isdigit()):
        raise ParseError(path, lineno, f"{what}: expected an unsigned decimal integer, got {token[:40]!r}")
    return int(token)


def cpu_id(label: str, prefix: str, path: str, lineno: int) -> int:
    """``cpu12`` / ``CPU12`` -> 12."""
    num = label[len(prefix):]
    if not label.startswith(prefix) or not (num.isascii() and num.isdigit()):
        raise ParseError(path, lineno, f"expected {prefix}<N>, got {label[:40]!r}")
    return int(num)


def ufloat(token: str, path: str, lineno: int, what: str) -> float:
    """A non-negative decimal like ``0.19`` as printed by ``%lu.%02lu``."""
    head, dot, tail = token.partition(".")
    ok = head.isascii() and head.isdigit() and (not dot or (tail.isascii() and tail.isdigit()))
    if not ok:
        raise ParseError(path, lineno, f"{what}: expected a decimal number, got {token[:40]!r}")
    return float(token)


_DIGITS_WS = b"0123456789 \n"


def int_block(text: str) -> npt.NDArray[np.int64] | None:
    """Every whitespace-separated token of ``text`` as int64 in one C call, or None when
    ``text`` holds anything but ASCII digits, spaces and newlines (the caller then falls back to
    its strict per-line parser, which names the offending line). Values > int64 clamp (strtoll),
    so callers bound-check where a width matters."""
    import numpy as np

    if not text.isascii() or text.encode("ascii").translate(None, _DIGITS_WS):
        return None
    return np.fromstring(text, dtype=np.int64, sep=" ")


def cpu_header(tokens: list[str], prefix: str, path: str, lineno: int) -> tuple[int, ...]:
    """``["CPU0", "CPU1", ...]`` -> (0, 1, ...), fast for the 256-column headers."""
    joined = " " + " ".join(tokens)
    if tokens and joined.count(" " + prefix) == len(tokens) == joined.count(prefix):
        ids = int_block(joined.replace(prefix, ""))
        if ids is not None and ids.size == len(tokens):
            return tuple(ids.tolist())
    return tuple(cpu_id(t, prefix, path, lineno) for t in tokens)


def cpu_header_line(lines: list[str], path: str) -> tuple[int, ...]:
    """The 'CPU0 CPU1 ...' header of /proc/softirqs and /proc/interrupts (first line; one column per CPU
    the kernel prints), as CPU ids; missing or duplicate columns are ParseErrors on line 1."""
    header = lines[0].split() if lines else []
    if not header:
        raise ParseError(path, 1, "missing 'CPU0 CPU1 ...' header")
    cpus = cpu_header(header, "CPU", path, 1)
    if len(set(cpus)) != len(cpus):
        raise ParseError(path, 1, "duplicate CPU column in header")
    return cpus
