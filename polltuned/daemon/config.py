"""Daemon configuration file (/etc/polltuned/polltuned.toml), validated at the edge."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from polltuned.errors import PolicyError
from polltuned.policy.loader import format_validation_error, read_toml
from polltuned.study.config import StudyConfig


class MetricsConfig(BaseModel):
    """Prometheus export of the daemon's state (polltuned.daemon.metrics); both ways out are opt-in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_remote: bool = False
    http_address: str | None = Field(None, description="serve /metrics on this address (loopback unless "
                                     "allow_remote); unset = no listener")
    http_port: int = Field(9877, ge=1, le=65535)
    textfile: str | None = Field(None, description="node_exporter textfile-collector file, rewritten atomically "
                                 "when the status is published; unset = none")
    textfile_min_interval_s: float = Field(1.0, ge=0, le=3600)

    @field_validator("http_address")
    @classmethod
    def _loopback(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return None
        if v == "localhost":
            return "127.0.0.1"
        try:
            ip = ipaddress.ip_address(v.strip("[]"))
        except ValueError:
            raise ValueError("must be an IP address such as 127.0.0.1 or ::1") from None
        if not ip.is_loopback and not info.data.get("allow_remote"):
            raise ValueError("must be a loopback address (127.0.0.0/8 or ::1) unless metrics.allow_remote = true")
        return str(ip)

    @field_validator("textfile")
    @classmethod
    def _prom_file(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if not v.startswith("/") or not v.endswith(".prom") or v.endswith("/.prom"):
            raise ValueError("must be an absolute path ending in .prom (node_exporter's textfile collector "
                             "reads only *.prom)")
        return v


class DaemonConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    policy: str = "latency-critical"
    nic: str | None = None
    state_dir: str = "/var/lib/polltuned"
    run_dir: str = "/run/polltuned"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    status_interval_s: float = Field(5.0, gt=0)
    #: while the daemon holds, status is refreshed at once when a HOLD window ends (or anything
    #: else changes) and otherwise only this often (issue 14: a status document costs ~25 ms of CPU,
    #: most of the daemon's CPU in HOLD at every 5 s)
    hold_status_interval_s: float = Field(30.0, gt=0)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    study: StudyConfig = Field(default_factory=StudyConfig)


def load_config(path: str | Path) -> DaemonConfig:
    p = Path(path)
    data = read_toml(p)
    try:
        return DaemonConfig.model_validate(data)
    except ValidationError as e:
        raise PolicyError(format_validation_error(str(p), e)) from None
