"""Daemon configuration file (/etc/polltuned/polltuned.toml), validated at the edge."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from polltuned.errors import PolicyError


class DaemonConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    policy: str = "latency-critical"
    nic: str | None = None
    state_dir: str = "/var/lib/polltuned"
    run_dir: str = "/run/polltuned"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    status_interval_s: float = Field(5.0, gt=0)


def load_config(path: str | Path) -> DaemonConfig:
    from polltuned.policy.loader import format_validation_error, read_toml

    p = Path(path)
    data = read_toml(p)
    try:
        return DaemonConfig.model_validate(data)
    except ValidationError as e:
        raise PolicyError(format_validation_error(str(p), e)) from None
