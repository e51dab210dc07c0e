"""The fleet store: a host's local SQLite study plus the class's shared PostgreSQL study.

Every record is committed locally first, then to the shared database, so

* the host's own history (resume, warm start, RESUME of a confirmed deployment) never depends on
  the network: it is read from the local store;
* the class sees each window as soon as it is committed to PostgreSQL (before the engine moves
  on): a host killed mid-trial loses none of the fleet's observations, and its pending trial
  expires after ``pending_timeout_s``;
* a database that cannot be reached at start, or fails mid-session, is dropped for the rest of
  the session with one warning (log and status): the host tunes alone on its local store
  (``join_class`` answers False, nothing is shared) and the next tuning round tries again.

A host's verdict (the engine's ``end`` record) is written back to the shared session row, so the
class keeps what each host confirmed on itself.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from polltuned.records import KnobValue
from polltuned.study.base import SessionLog, StoreUnavailable, Study, StudyInfo
from polltuned.study.postgres import PostgresStudy
from polltuned.study.sqlite import SqliteStudy

log = logging.getLogger("polltuned.study")

T = TypeVar("T")

#: status re-counts the class's hosts at most this often
REFRESH_S = 60.0


class FleetStudy(Study):
    backend = "postgresql"

    def __init__(self, local: SqliteStudy, remote: PostgresStudy | None, *, location: str,
                 class_key: str | None, fallback: str | None = None) -> None:
        self.local = local
        self.remote = remote
        self.fingerprint = local.fingerprint
        self.location = location
        self.class_key = class_key
        self.fallback = fallback
        self._membership = "not joined yet" if remote is not None else "alone: shared store unavailable"
        self._hosts: int | None = None
        self._counted = -1e18
        if fallback is not None:
            log.warning("study: %s", fallback)

    # ---------------------------------------------------------------- the shared side, guarded
    def _shared(self, what: str, fn: Callable[[PostgresStudy], T], default: T) -> T:
        if self.remote is None:
            return default
        try:
            return fn(self.remote)
        except StoreUnavailable as e:
            self._degrade(f"{what}: {e.message}")
            return default

    def _degrade(self, why: str) -> None:
        self.fallback = (f"postgresql {self.location} failed ({why}): tuning alone on the local store "
                         f"{self.local.path} for the rest of this round")
        self._membership = "alone: shared store unavailable"
        log.warning("study: %s", self.fallback)
        if self.remote is not None:
            self.remote.close()
        self.remote = None

    # ---------------------------------------------------------------- records
    def append(self, kind: str, **fields: Any) -> None:
        self.local.append(kind, **fields)
        self._shared(f"writing a {kind} record", lambda r: r.append(kind, **fields), None)

    def sessions(self) -> list[SessionLog]:
        return self.local.sessions()

    # ---------------------------------------------------------------- fleet hooks
    def join_class(self, session: str, baseline_j: float, noise_sd: float) -> bool:
        if self.remote is None:
            log.warning("study: the shared store is unavailable: this host tunes alone (class %s)", self.class_key)
            return False
        ok = self._shared("joining the class", lambda r: r.join_class(session, baseline_j, noise_sd), False)
        if self.remote is not None:
            self._membership = self.remote.describe().membership
            self._hosts = self.remote.describe().hosts
        return ok

    def shared_observations(self, session: str, baseline: Mapping[str, KnobValue]
                            ) -> list[tuple[dict[str, KnobValue], float]]:
        return self._shared("reading the class's observations", lambda r: r.shared_observations(session, baseline),
                            [])

    def pending_configs(self, session: str) -> list[dict[str, KnobValue]]:
        return self._shared("reading pending trials", lambda r: r.pending_configs(session), [])

    def set_pending(self, session: str, config: Mapping[str, KnobValue] | None) -> None:
        self._shared("announcing a pending trial", lambda r: r.set_pending(session, config), None)

    # ---------------------------------------------------------------- describe
    def refresh(self) -> None:
        """Re-count the class's hosts (one query)."""
        n = self._shared("counting the class's hosts", lambda r: r.class_hosts(), None)
        if n is not None:
            self._hosts = n
        if self.remote is not None:
            self._counted = self.remote.clock.monotonic()

    def describe(self) -> StudyInfo:
        """What status shows; the class's host count is re-read at most once a minute."""
        if self.remote is not None and self.remote.clock.monotonic() - self._counted >= REFRESH_S:
            self.refresh()
        return StudyInfo("postgresql", self.location, self.fingerprint, class_key=self.class_key, hosts=self._hosts,
                         membership=self._membership, fallback=self.fallback, local=str(self.local.path))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.local.close()
        if self.remote is not None:
            self.remote.close()
