"""Shared helpers for the pure counter parsers (no I/O)."""

from __future__ import annotations

from polltuned.errors import ParseError


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
