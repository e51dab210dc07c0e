"""``[study]`` in the daemon config: which store holds the trial history (validated at the edge).

    [study]
    backend = "sqlite"          # "sqlite" (default) | "jsonl" | "postgresql"
    dsn = "postgresql://polltuned@db.example/polltuned"   # only with backend = "postgresql"

With ``postgresql`` the hosts of one workload class share a study in that database; every host
also keeps its own records in its local SQLite store and tunes alone on it when the database is
unreachable. Put the password in a libpq password file (``passfile=`` or ``~/.pgpass``), not in
the DSN: status and history show the DSN with any password removed.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

_KV = re.compile(r"^\s*(?:[A-Za-z_]+\s*=\s*(?:'(?:[^'\\]|\\.)*'|[^\s']+)\s*)+$")
_PASSWORD_KV = re.compile(r"\bpassword\s*=\s*(?:'(?:[^'\\]|\\.)*'|\S+)\s*", re.IGNORECASE)


def redact_dsn(dsn: str) -> str:
    """The DSN without its password (URL or key=value form)."""
    if dsn.startswith(("postgresql://", "postgres://")):
        u = urlsplit(dsn)
        netloc = u.netloc
        if "@" in netloc:
            cred, host = netloc.rsplit("@", 1)
            netloc = cred.split(":", 1)[0] + "@" + host
        query = urlencode([(k, v) for k, v in parse_qsl(u.query) if k.lower() != "password"])
        return urlunsplit((u.scheme, netloc, u.path, query, u.fragment))
    return _PASSWORD_KV.sub("", dsn).strip()


class StudyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["sqlite", "jsonl", "postgresql"] = "sqlite"
    dsn: str | None = Field(None, validate_default=True, description="libpq connection string or "
                            "postgresql:// URL of the fleet's database (backend = \"postgresql\" only)")
    host_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:@-]{1,128}$",
                                description="this host's name in the fleet (default: hostname + machine-id)")
    connect_timeout_s: float = Field(5.0, ge=1, le=60)
    pending_timeout_s: float | None = Field(None, gt=0, description="a trial announced longer ago than this is "
                                            "a dead host's and no longer kept from the others (default: "
                                            "6 x (window_s + settle_s), at least 60 s)")
    max_level_ratio: float = Field(1.5, gt=1, description="a host whose baseline J is more than this factor "
                                   "from the class median tunes alone")
    max_noise_ratio: float = Field(2.5, gt=1, description="likewise for its window-to-window noise")

    @field_validator("dsn")
    @classmethod
    def _dsn(cls, v: str | None, info: ValidationInfo) -> str | None:
        backend = info.data.get("backend")
        if backend != "postgresql":
            if v is not None:
                raise ValueError(f'only used with backend = "postgresql" (backend is "{backend}")')
            return None
        if v is None or not v.strip():
            raise ValueError('required with backend = "postgresql" (e.g. "postgresql://polltuned@db/polltuned")')
        if "\n" in v:
            raise ValueError("must be one line")
        if v.startswith(("postgresql://", "postgres://")):
            if not urlsplit(v).netloc and "host=" not in v:
                raise ValueError("a postgresql:// URL needs a host (postgresql://USER@HOST/DB)")
            return v
        if not _KV.match(v):
            raise ValueError("must be a postgresql:// URL or libpq key=value pairs (host=... dbname=...)")
        return v
