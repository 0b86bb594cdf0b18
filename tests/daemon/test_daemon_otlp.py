"""OTLP push: a daemon started with OTEL_EXPORTER_OTLP_ENDPOINT pushes the catalog to a real
OTLP/HTTP receiver run here (http.server decoding the protobuf ExportMetricsServiceRequest
with opentelemetry-proto), with the resource naming the host and the newest boot."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from tests.daemon.test_daemon_flightstate import GiB, census, mark, rank_recorder
from tests.daemon.test_daemon_serve import serve

from rankscope import catalog
from rankscope.daemon.otlp import instrument_names
from support.services import free_port
from support.waiting import wait_for


class Receiver:
    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.lock = threading.Lock()

    def metrics(self) -> list[tuple[dict[str, str], str, Any]]:
        """(resource attributes, metric name, metric) of every metric received so far."""
        out = []
        with self.lock:
            for req in self.requests:
                for rm in req.resource_metrics:
                    resource = {a.key: a.value.string_value for a in rm.resource.attributes}
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            out.append((resource, m.name, m))
        return out


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, Receiver]]:
    receiver = Receiver()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            req = ExportMetricsServiceRequest()
            req.ParseFromString(body)
            with receiver.lock:
                receiver.requests.append(req) if self.path == "/v1/metrics" else None
            self.send_response(200 if self.path == "/v1/metrics" else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def points(metric: Any) -> list[tuple[dict[str, str], float]]:
    data = metric.gauge if metric.HasField("gauge") else metric.sum
    return [
        ({a.key: a.value.string_value for a in p.attributes}, p.as_double or float(p.as_int))
        for p in data.data_points
    ]


def test_the_daemon_pushes_the_catalog_over_otlp_http(flight_dir: Path, tmp_path: Path) -> None:
    rec = rank_recorder(flight_dir, "boot-otlp-1", 0, pid=3100)
    rec.write_record(mark("weights_loaded", reserved=12 * GiB))
    rec.write_record(census(3, [["tp:0-1", "all_reduce", 42]]))
    with otlp_receiver() as (endpoint, receiver):
        env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
        with serve(
            flight_dir, "--otlp.interval=500ms", "--no-collector.cards", "--no-collector.holdings",
            log=tmp_path / "serve.log", env=env,
        ):  # fmt: skip
            got = wait_for(
                lambda: (
                    {name: (res, m) for res, name, m in receiver.metrics()}
                    if any(n == "rankscope_collectives" for _r, n, _m in receiver.metrics())
                    else None
                ),
                timeout=20.0,
                interval=0.2,
                what="the OTLP push of the catalog",
            )
            resource, reserved = got["rankscope_phase_reserved_bytes"]
            assert resource["service.name"] == "rankscope"
            assert resource["host.name"] == socket.gethostname()
            assert resource["rankscope.boot"] == "boot-otlp-1"
            assert reserved.unit == "By"
            assert reserved.description == catalog.BY_NAME["rankscope_phase_reserved_bytes"].help
            ((labels, value),) = points(reserved)
            assert (
                value == 12 * GiB and labels["phase"] == "weights_loaded" and labels["rank"] == "0"
            )
            _res, collectives = got["rankscope_collectives"]
            assert collectives.sum.is_monotonic
            ((labels, value),) = points(collectives)
            assert value == 42 and labels["group"] == "tp:0-1"
            # Every name pushed is a catalog instrument.
            allowed = {n for m in catalog.CATALOG for n, _sample in instrument_names(m)}
            assert set(got) <= allowed

            # A new boot: the resource follows it.
            new = rank_recorder(flight_dir, "boot-otlp-2", 0, pid=3200)
            new.write_record(mark("pre_weight_load"))
            wait_for(
                lambda: any(
                    res.get("rankscope.boot") == "boot-otlp-2" for res, _n, _m in receiver.metrics()
                ),
                timeout=20.0,
                interval=0.2,
                what="a push with the new boot's resource",
            )
