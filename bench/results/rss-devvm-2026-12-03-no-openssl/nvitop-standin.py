# A stand-in for nvitop-exporter without a GPU: its modules, serving an empty registry
# through prometheus_client's WSGI server (as bench/results/rss-devvm-2026-12-03 did).
import time

import nvitop_exporter.cli  # noqa: F401
from prometheus_client import start_wsgi_server

start_wsgi_server(5050, addr="127.0.0.1")
time.sleep(120)
