"""Daemon configuration file (/etc/polltuned/polltuned.toml), validated at the edge."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from polltuned.errors import PolicyError


class DaemonConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = "latency-critical"
    nic: str | None = None
    state_dir: str = "/var/lib/polltuned"
    run_dir: str = "/run/polltuned"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    status_interval_s: float = Field(5.0, gt=0)


def load_config(path: str | Path) -> DaemonConfig:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise PolicyError([f"{p}: cannot read: {e.strerror}"]) from e
    except tomllib.TOMLDecodeError as e:
        raise PolicyError([f"{p}: not valid TOML: {e}"]) from e
    try:
        return DaemonConfig.model_validate(data)
    except ValidationError as e:
        from polltuned.policy.loader import format_validation_error

        raise PolicyError(format_validation_error(str(p), e)) from None
