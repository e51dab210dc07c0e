"""The only door to the kernel: every /proc, /sys, netlink, ioctl and subprocess access lives here.

Everything else takes a :class:`Host`. ``FsHost(root)`` roots both /proc and /sys at ``root``
so tests run against recorded fake trees and the same code runs for real with root ``/``.
"""

from polltuned.host.fs import FsHost, Host

__all__ = ["FsHost", "Host"]
