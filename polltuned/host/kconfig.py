"""Kernel build configuration (/proc/config.gz, else /boot/config-$(uname -r))."""

from __future__ import annotations

import gzip
import os

from polltuned.host.fs import Host


def read_kernel_config(host: Host) -> str | None:
    """The kernel .config text, or None when neither source exists/reads."""
    try:
        with gzip.open(host.path("/proc/config.gz"), "rt", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except (OSError, EOFError):
        pass
    if host.is_real:
        p = f"/boot/config-{os.uname().release}"
        if host.exists(p):
            try:
                return host.read_text(p)
            except Exception:
                return None
    else:
        # fake trees may carry a plain-text copy
        if host.exists("/proc/config"):
            return host.read_text("/proc/config")
    return None
