"""Typed errors with stable kebab-case references and named exit codes.

Every error polltuned reports to a user is a PolltunedError: it renders as one line
``polltuned: error[<code>]: <message>`` plus an optional hint line. Tracebacks are only
shown with ``--debug``.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    FAILURE = 1          # generic runtime failure
    USAGE = 2            # bad input: policy/config/CLI value invalid
    DIRTY = 3            # host still carries polltuned values (status/rollback --if-dirty)
    UNSUPPORTED = 4      # capability missing on this host
    PERMISSION = 5       # needs root / CAP_NET_ADMIN; as root: an untrusted (non-root-writable) file
    LOCKED = 6           # another instance holds the lock, or a daemon owns the host (apply/rollback)
    JOURNAL = 7          # journal corrupt, unreadable, unverified (host state unknown) or not writable
    PROBE = 8            # measurement failed


def one_line(text: str) -> str:
    """``text`` safe to print as one line: control characters (newlines, escapes, NUL) from user
    input are shown escaped instead of breaking the line or the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class PolltunedError(Exception):
    """Root of every user-facing error."""

    code: str = "error"
    exit_code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, *, hint: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code

    def render(self) -> str:
        line = f"polltuned: error[{self.code}]: {one_line(self.message)}"
        if self.hint:
            line += f"\n  hint: {one_line(self.hint)}"
        return line


class UsageError(PolltunedError):
    code = "usage"
    exit_code = ExitCode.USAGE


class PolicyError(PolltunedError):
    """A policy or config file failed validation. ``problems`` holds one line per problem."""

    code = "policy-invalid"
    exit_code = ExitCode.USAGE

    def __init__(self, problems: list[str], *, hint: str | None = None) -> None:
        super().__init__("; ".join(problems) if problems else "invalid policy", hint=hint)
        self.problems = problems

    def render(self) -> str:
        lines = [f"polltuned: error[{self.code}]: {one_line(p)}" for p in self.problems] or [super().render()]
        if self.hint:
            lines.append(f"  hint: {one_line(self.hint)}")
        return "\n".join(lines)


class ParseError(PolltunedError):
    """A kernel file did not have the format we expect. Names the file and line."""

    code = "parse"

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


class HostError(PolltunedError):
    """Reading or writing a kernel interface failed (errno preserved)."""

    code = "host"

    def __init__(self, message: str, *, errno: int | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.errno = errno


class ModelWorkerError(PolltunedError):
    """The model worker (polltuned.optimiser.worker, the daemon's GP in a process of its own) died,
    did not answer in time, or answered garbage: the engine gets this, never a hang."""

    code = "model-worker"


class ModelWorkerGone(ModelWorkerError):
    """The model worker had exited (idle, killed) before it answered: the proxy starts another from
    the state it keeps and asks again, once."""

    code = "model-worker-gone"


class KnobValueError(PolltunedError):
    code = "knob-value"
    exit_code = ExitCode.USAGE


class KnobUnsupported(PolltunedError):
    code = "knob-unsupported"
    exit_code = ExitCode.UNSUPPORTED


class JournalError(PolltunedError):
    code = "journal-corrupt"
    exit_code = ExitCode.JOURNAL


class JournalUnreadable(JournalError):
    """The journal (or its state directory) could not be read or written: an I/O error, not damage."""

    code = "journal-unreadable"


class StateNotWritable(JournalError):
    """The state directory cannot take a write: disk full (ENOSPC), quota (EDQUOT) or a read-only
    file system (EROFS). Rollback still restores the knobs and says the journal could not record it."""

    code = "state-not-writable"


class JournalUnverified(JournalError):
    """The journal cannot be proven complete (its baseline copy is missing or damaged, or both are
    gone after polltuned ran): the host's state is *unknown*, never reported as clean (exit 7)."""

    code = "journal-unverified"


class JournalCopiesDisagree(JournalError):
    """The journal and the baseline copy give different originals for the same knob: reported,
    never resolved by polltuned (nothing is written until one of them is moved aside)."""


class ProbeError(PolltunedError):
    code = "probe-failed"
    exit_code = ExitCode.PROBE


class LockedError(PolltunedError):
    code = "locked"
    exit_code = ExitCode.LOCKED


class PermissionNeeded(PolltunedError):
    code = "permission"
    exit_code = ExitCode.PERMISSION
