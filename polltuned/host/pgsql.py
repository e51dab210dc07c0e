"""The door to a PostgreSQL server (the fleet's shared study store): one connection, opened here
because it is a socket (house rule 1). psycopg 3 is imported lazily: only a daemon configured with
``[study] backend = "postgresql"`` loads it.

The connection is in autocommit mode (the store opens one explicit transaction per record), with a
connect timeout and a statement timeout, so an unreachable or stuck server costs a bounded wait
and then an error the store turns into "tuning alone on the local store".
"""

from __future__ import annotations

import math
from typing import Any

from polltuned.errors import HostError


def connect_postgres(dsn: str, *, connect_timeout_s: float = 5.0, statement_timeout_s: float = 10.0,
                     application_name: str = "polltuned") -> Any:
    """A psycopg ``Connection`` (autocommit). Raises HostError with libpq's first line (the DSN,
    which may carry a password, is never part of the message)."""
    try:
        import psycopg
    except ImportError as e:
        raise HostError(f"psycopg (PostgreSQL client) is not installed: {e}",
                        hint="pip install 'psycopg[binary]' into polltuned's venv") from None
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=max(2, math.ceil(connect_timeout_s)),
                               application_name=application_name)
        conn.execute(f"SET statement_timeout = {max(1, int(statement_timeout_s * 1000))}")
    except psycopg.Error as e:
        raise HostError(first_line(e)) from None
    return conn


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
