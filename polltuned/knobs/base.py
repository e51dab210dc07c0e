"""The Knob contract: read, validate, write, verify, snapshot/restore, and a hard domain.

A knob is one kernel interface value polltuned may change, addressed by a key in kernel vocabulary
(``net.core.busy_poll``, ``eth0:gro_flush_timeout``, ``eth0:napi:irq-suspend-timeout``...).

Two views of a knob's state:

* ``read()`` -> the user-level value (an int, or a string for strategies). The actuator journals
  it after every write ("applied") and compares it with the live value to detect admin changes.
* ``snapshot()`` -> the exact restorable state as JSON (for most knobs the same as ``read()``;
  for composite knobs such as the per-device NAPI sysfs files it also carries the per-NAPI layer,
  for IRQ affinity the per-IRQ CPU lists). The baseline journaled at first touch is a snapshot and
  rollback calls ``restore(snapshot)``.

Only :class:`polltuned.actuator.Actuator` calls ``write``/``restore``.
"""

from __future__ import annotations

import errno as errno_mod
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from polltuned.errors import HostError, KnobValueError, ParseError
from polltuned.records import KnobValue

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None

INT_MAX = 2**31 - 1
S32_MAX = INT_MAX
U32_MAX = 2**32 - 1
ULONG_MAX = 2**64 - 1

#: errnos that mean "the object this knob lives on is gone" (device deleted, netns removed, IRQ freed)
GONE_ERRNOS = frozenset({errno_mod.ENOENT, errno_mod.ENODEV, errno_mod.ENXIO})


class KnobGone(HostError):
    """The device/IRQ/netns a managed knob lives on vanished."""

    code = "knob-gone"


@dataclass(frozen=True)
class Domain:
    """Hard limits for a knob's value, from the kernel reference (knobs.md section 3).

    ``kind == "int"``: inclusive ``lo..hi``; ``kind == "choice"``: one of ``choices``.
    ``unit`` and ``note`` are for humans (``polltuned check``).
    """

    kind: Literal["int", "choice"]
    lo: int = 0
    hi: int = 0
    choices: tuple[str, ...] = ()
    unit: str = ""
    note: str = ""

    def describe(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        return f"{self.lo}..{self.hi}" + (f" {self.unit}" if self.unit else "")

    def to_json(self) -> dict[str, JsonValue]:
        d: dict[str, JsonValue] = {"kind": self.kind, "unit": self.unit, "note": self.note}
        if self.kind == "choice":
            d["choices"] = list(self.choices)
        else:
            d["min"] = self.lo
            d["max"] = self.hi
        return d


def int_domain(lo: int, hi: int, unit: str = "", note: str = "") -> Domain:
    return Domain("int", lo=lo, hi=hi, unit=unit, note=note)


def choice_domain(choices: Sequence[str], note: str = "") -> Domain:
    return Domain("choice", choices=tuple(choices), note=note)


def check_value(key: str, domain: Domain, value: object) -> KnobValue:
    """Validate ``value`` against ``domain``; return it normalised (int or str).

    Accepts ints, integral floats and decimal strings for int knobs (CLI values arrive as text).
    Raises KnobValueError naming knob, value and allowed range. Never touches the host.
    """
    if domain.kind == "choice":
        s = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
        if s is None or s not in domain.choices:
            raise KnobValueError(f"{key}: {value!r} is not {domain.describe()}")
        return s
    iv: int | None = None
    if isinstance(value, bool):
        iv = None
    elif isinstance(value, int):
        iv = value
    elif isinstance(value, float) and value.is_integer():
        iv = int(value)
    elif isinstance(value, str):
        t = value.strip()
        digits = t[1:] if t[:1] in ("+", "-") else t
        if digits.isascii() and digits.isdigit():  # "²" and "٣" are digits to str.isdigit, not to sysctl
            if len(digits) > 30:
                raise KnobValueError(f"{key}: {t[:24]}… ({len(digits)} digits) is outside {domain.describe()}")
            iv = int(t)
    if iv is None:
        raise KnobValueError(f"{key}: {value!r} is not an integer (allowed {domain.describe()})")
    if not domain.lo <= iv <= domain.hi:
        raise KnobValueError(f"{key}: {iv} is outside {domain.lo}..{domain.hi}"
                             + (f" {domain.unit}" if domain.unit else "")
                             + (f" ({domain.note})" if domain.note else ""))
    return iv


@dataclass(frozen=True)
class Availability:
    """Whether a knob can be used on this host, and why not."""

    present: bool
    writable: bool
    reason: str = ""
    notices: tuple[str, ...] = field(default=())
    #: things a user must hear when this knob is applied (e.g. managed IRQs skipped); logged once per apply
    warnings: tuple[str, ...] = field(default=())


class Knob(ABC):
    """One tunable kernel value. Subclasses: one per kernel interface (see polltuned.knobs)."""

    key: str
    kind: str
    domain: Domain

    @abstractmethod
    def availability(self) -> Availability:
        """Present/writable/reason, without writing anything."""

    @abstractmethod
    def read(self) -> KnobValue:
        """The live user-level value. Raises KnobGone when the underlying object vanished."""

    def validate(self, value: object) -> KnobValue:
        return check_value(self.key, self.domain, value)

    @abstractmethod
    def write(self, value: KnobValue, *, baseline: JsonValue = None) -> None:
        """Write an already validated value. ``baseline`` is the first-touch snapshot, for
        strategies that mean "what was there" (``kernel-default``)."""

    def verify(self, value: KnobValue) -> bool:
        """True when the live value is what ``write(value)`` asked for."""
        return self.read() == value

    def snapshot(self) -> JsonValue:
        v = self.read()
        return v

    def restore(self, state: JsonValue) -> None:
        if not isinstance(state, (int, str)) or isinstance(state, bool):
            raise HostError(f"{self.key}: cannot restore from snapshot {state!r}")
        self.write(state)

    def matches(self, state: JsonValue) -> bool:
        """True when the live state equals ``state`` (used to verify a restore)."""
        return self.snapshot() == state

    # -- per-part ownership and re-created components (HOLD's watcher, admin wins per part) -------
    def parts(self, value: KnobValue | None) -> dict[str, str] | None:
        """The independently owned parts of a value in ``read()`` form (IRQ affinity: IRQ -> CPU
        list), or None for an indivisible value (the default). Someone else's change to one part
        releases that part only; polltuned keeps managing the others."""
        return None

    def without_parts(self, value: KnobValue, baseline: JsonValue, parts: frozenset[str]) -> KnobValue:
        """``value`` (validated) narrowed so that writing it leaves ``parts`` untouched."""
        return value

    def state_without(self, state: JsonValue, parts: frozenset[str]) -> JsonValue:
        """A snapshot without ``parts``: restoring or matching it leaves them alone."""
        return state

    def extend_baseline(self, state: JsonValue, value: KnobValue | None, now_state: JsonValue,
                        now_value: KnobValue | None) -> tuple[JsonValue, KnobValue | None]:
        """The first-touch baseline (snapshot ``state``, ``read()`` form ``value``) plus the
        components of the live snapshot it does not know yet: NAPIs or IRQs the kernel created since
        (link down/up, driver reset, more queues), whose live values are the kernel's defaults when
        polltuned has not written them. Known components are never changed. Default: unchanged."""
        return state, value


def gone_or_raise(key: str, err: HostError) -> HostError:
    """Map a HostError on a knob's object to KnobGone when the errno says it vanished."""
    if err.errno in GONE_ERRNOS:
        return KnobGone(f"{key}: {err.message}", errno=err.errno)
    return err


def parse_int_text(path: str, text: str) -> int:
    """Parse a single-integer kernel file (sysctl / sysfs attribute / module parameter).

    Kernel format: ``proc_dointvec`` and sysfs ``%d``/``%lu``/``%u`` attributes print the number
    followed by ``\\n`` (e.g. ``"50\\n"``).
    """
    t = text.strip()
    try:
        return int(t)
    except ValueError:
        raise ParseError(path, 1, f"expected an integer, got {t[:40]!r}") from None
