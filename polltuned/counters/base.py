"""Collector protocol, the per-sample context and the generic file collector.

A *Collector* is a stateless description registered in ``COLLECTORS`` (polltuned.counters);
``start(host, ctx)`` returns a *Reader* that holds the per-family state (paths resolved once,
netlink sockets, ...) and is asked for one record per sample. Readers raise:

* :class:`Absent` when the kernel interface does not exist here (older kernel, config off) —
  the family is reported unavailable with reason "absent on this kernel: <path>";
* :class:`polltuned.errors.ParseError` for malformed input — the Sampler disables the family;
* :class:`polltuned.errors.HostError` for I/O failures.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from polltuned.counters.nicmap import NicInfo
from polltuned.errors import HostError
from polltuned.host.fs import FsHost, Host, KeptFile

T = TypeVar("T")


class Absent(Exception):
    """The interface a collector reads does not exist on this kernel/host."""

    def __init__(self, what: str, *, reason: str | None = None) -> None:
        self.reason = reason if reason is not None else f"absent on this kernel: {what}"
        super().__init__(self.reason)


@dataclass(frozen=True)
class SampleContext:
    nic_map: Mapping[str, NicInfo] = field(default_factory=dict)
    pids: Callable[[], Iterable[int]] | None = None


class Reader(Protocol):
    def read(self) -> object: ...
    def close(self) -> None: ...


class Collector(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def default(self) -> bool: ...
    @property
    def doc(self) -> str: ...
    def start(self, host: Host, ctx: SampleContext) -> Reader: ...


_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.EOPNOTSUPP)


def read_or_absent(host: Host, path: str) -> str:
    try:
        return host.read_text(path)
    except HostError as e:
        if e.errno in _ABSENT:
            raise Absent(path) from e
        raise


class TextSource:
    """Whole-file reads of one kernel path: a kept fd + pread on an FsHost (cheaper per
    sample), ``host.read_text`` for any other Host. Raises Absent when the file does not exist."""

    def __init__(self, host: Host, path: str) -> None:
        self._host = host
        self.path = path
        self._kept: KeptFile | None = None
        if isinstance(host, FsHost):
            try:
                self._kept = host.open_kept(path)
            except HostError as e:
                if e.errno in _ABSENT:
                    raise Absent(path) from e
                raise

    def read(self) -> str:
        if self._kept is not None:
            try:
                return self._kept.read()
            except HostError as e:
                if e.errno in _ABSENT:
                    raise Absent(self.path) from e
                raise
        return read_or_absent(self._host, self.path)

    def close(self) -> None:
        if self._kept is not None:
            self._kept.close()
            self._kept = None


class _FileReader(Generic[T]):
    def __init__(self, host: Host, path: str, parse: Callable[[str, str], T]) -> None:
        self._src = TextSource(host, path)
        self._path = path
        self._parse = parse

    def read(self) -> T:
        return self._parse(self._src.read(), self._path)

    def close(self) -> None:
        self._src.close()


@dataclass(frozen=True)
class FileCollector(Generic[T]):
    """One procfs file -> one record through a pure parser ``parse(text, path)``."""

    name: str
    path: str
    parse: Callable[[str, str], T]
    doc: str
    default: bool = True

    def start(self, host: Host, ctx: SampleContext) -> Reader:
        return _FileReader(host, self.path, self.parse)
