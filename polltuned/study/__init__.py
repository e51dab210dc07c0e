"""Durable trial history behind one interface (:class:`Study`).

Backends: JSON lines (polltuned.study.jsonl: today's format, still readable and writable), SQLite
(polltuned.study.sqlite: the default; WAL, one transaction per record) and PostgreSQL
(polltuned.study.postgres: one database for a fleet; polltuned.study.fleet pairs it with the
host's local SQLite store). The backends are chosen in one factory module, polltuned.study.select
(the base class knows none of them): ``open_local(state_dir, policy)`` opens the local default,
``memory_study(policy)`` a store in memory, ``open_for_host`` what the daemon config's ``[study]``
section names.
"""

from polltuned.study.base import (
    STUDY_VERSION,
    SessionLog,
    StoreUnavailable,
    Study,
    StudyInfo,
    WindowRecord,
    fingerprint,
)
from polltuned.study.jsonl import JsonlStudy, parse_study
from polltuned.study.select import memory_study, open_local

__all__ = ["STUDY_VERSION", "JsonlStudy", "SessionLog", "StoreUnavailable", "Study", "StudyInfo", "WindowRecord",
           "fingerprint", "memory_study", "open_local", "parse_study"]
