"""`qforge monitor`: wait for a current schema, then compete for leadership and keep the system moving."""

from __future__ import annotations

import argparse
import os
import signal
import socket

from qforge import tracing
from qforge.cli.common import configure_logging, database_url, wait_for_schema
from qforge.settings import get_settings
from qforge.workers.monitor import Monitor


def run(args: argparse.Namespace) -> int:
    settings = get_settings()
    configure_logging(settings)
    url = database_url("monitor", args.database_url, role="monitor")
    if url is None or not wait_for_schema("monitor", url):
        return 1
    tracing.configure("qforge-monitor")  # from OTEL_* variables, when set
    monitor = Monitor(url, name=f"{socket.gethostname()}-{os.getpid()}", settings=settings)
    signal.signal(signal.SIGTERM, monitor.stop)
    signal.signal(signal.SIGINT, monitor.stop)
    return monitor.run()
