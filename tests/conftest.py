"""Shared fixtures.

``real_kernel``: for tests that change real global kernel knobs or create namespaces. Skips with a
clear reason when not root; serialises against every other real-kernel user on the machine with an
flock on /tmp/polltuned-realkernel.lock (helpers, benches and CI share one VM).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REALKERNEL_LOCK = "/tmp/polltuned-realkernel.lock"
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def real_kernel() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("needs root: this test changes real kernel knobs / network namespaces")
    fd = os.open(REALKERNEL_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
