"""argparse value types that refuse what a sysadmin did not mean: non-ASCII digits (``²``, ``٣``),
``inf``/``nan``, out-of-range numbers. Each raises ArgumentTypeError with the accepted range, which
the parser turns into one ``polltuned: error[usage]`` line."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

_INT = re.compile(r"[+-]?[0-9]{1,30}", re.ASCII)
_FLOAT = re.compile(r"[+-]?([0-9]{1,30}(\.[0-9]{0,30})?|\.[0-9]{1,30})([eE][+-]?[0-9]{1,3})?", re.ASCII)


def _show(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "…")


def int_range(lo: int, hi: int) -> Callable[[str], int]:
    """An ASCII decimal integer in ``lo..hi``."""

    def parse(text: str) -> int:
        t = text.strip()
        if not _INT.fullmatch(t):
            raise argparse.ArgumentTypeError(f"expected an integer {lo}..{hi} (got {_show(text)})")
        v = int(t)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be {lo}..{hi} (got {v})")
        return v

    parse.__name__ = "integer"
    return parse


def finite_float(lo: float, hi: float, *, lo_open: bool = True) -> Callable[[str], float]:
    """A finite ASCII decimal number in ``(lo, hi]`` (``[lo, hi]`` when ``lo_open`` is False)."""

    def parse(text: str) -> float:
        t = text.strip()
        if not _FLOAT.fullmatch(t):
            raise argparse.ArgumentTypeError(f"expected a finite number (got {_show(text)})")
        v = float(t)
        low_ok = v > lo if lo_open else v >= lo
        if not math.isfinite(v) or not low_ok or v > hi:
            raise argparse.ArgumentTypeError(f"must be {'>' if lo_open else '>='} {lo:g} and <= {hi:g} (got {t})")
        return v

    parse.__name__ = "number"
    return parse


#: seeds go to numpy / random: 0..2**32-1
SEED = int_range(0, 2**32 - 1)
