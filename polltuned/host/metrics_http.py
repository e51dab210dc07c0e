"""The metrics HTTP listener: prometheus_client's threaded WSGI server on one address.

Opened here because only polltuned/host/ opens sockets. The daemon config allows loopback addresses
only unless ``metrics.allow_remote`` is set (polltuned.daemon.config); this module binds whatever it
is given. The server runs in a daemon thread; ``close()`` stops serving, closes the listening socket
(so the port is free again at once) and joins the thread.
"""

from __future__ import annotations

import errno as errno_mod
import os
import threading
from typing import Any

from polltuned.errors import HostError


class MetricsServer:
    def __init__(self, httpd: Any, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        host, port = httpd.server_address[:2]
        self.address: str = str(host)
        self.port: int = int(port)

    def close(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)
        self._httpd = None


def serve_metrics(registry: Any, address: str, port: int) -> MetricsServer:
    """Serve ``registry`` at http://address:port/metrics (port 0: any free port, see ``.port``)."""
    from prometheus_client import start_http_server

    try:
        httpd, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as e:
        code = e.errno if isinstance(e.errno, int) and e.errno > 0 else errno_mod.EINVAL
        why = os.strerror(e.errno) if isinstance(e.errno, int) and e.errno > 0 else str(e)
        raise HostError(f"cannot listen on {address} port {port} for metrics: {why}", errno=code) from e
    thread.name = "polltuned-metrics-http"
    return MetricsServer(httpd, thread)
