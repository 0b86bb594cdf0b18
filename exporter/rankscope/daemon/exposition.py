"""The /metrics encoders, chosen by the Accept header: OpenMetrics 1.0.0 (client_python's)
and the Prometheus text format 0.0.4 (client_python's generate_latest written again). Every
rankscope name is a legacy name, so text/plain 1.0.0 gets 0.0.4, whose body is the same.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = openmetrics.CONTENT_TYPE_LATEST

Encoder = Callable[[CollectorRegistry], bytes]

# An OpenMetrics family type -> (name suffix, type) in the text format.
_TEXT_TYPES = {
    "counter": ("_total", "counter"),
    "info": ("_info", "gauge"),
    "stateset": ("", "gauge"),
    "gaugehistogram": ("", "histogram"),
    "unknown": ("", "untyped"),
}
# Samples OpenMetrics has and the text format lacks: each is published as a gauge of its own
# after its family.
_OPENMETRICS_ONLY = ("_created", "_gsum", "_gcount")


def choose_encoder(accept: str) -> tuple[Encoder, str]:
    """OpenMetrics 1.0.0 when the Accept header names it (without a version, or at 1.0.0 or
    later), the text format otherwise; client_python's rule."""
    for accepted in accept.split(","):
        media, *params = (token.strip() for token in accepted.split(";"))
        if media != "application/openmetrics-text":
            continue
        version = next((v for k, _, v in (p.partition("=") for p in params) if k == "version"), "")
        if not version or _version(version) >= (1, 0, 0):
            return openmetrics.generate_latest, CONTENT_TYPE_OPENMETRICS
    return generate_text, CONTENT_TYPE_TEXT


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return ()


def generate_text(registry: CollectorRegistry) -> bytes:
    """The families of ``registry`` in the Prometheus text format 0.0.4."""
    output: list[str] = []
    for metric in registry.collect():
        suffix, kind = _TEXT_TYPES.get(metric.type, ("", metric.type))
        name = metric.name + suffix
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        output.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        extra: dict[str, list[str]] = {}
        for sample in metric.samples:
            only = next((s for s in _OPENMETRICS_ONLY if sample.name == metric.name + s), None)
            (extra.setdefault(only, []) if only else output).append(_sample_line(sample))
        for only, lines in sorted(extra.items()):
            name = metric.name + only
            output.append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n")
            output.extend(lines)
    return "".join(output).encode("utf-8")


def _sample_line(sample: Sample) -> str:
    labels = ",".join(
        f'{key}="{_escape_label_value(value)}"' for key, value in sorted(sample.labels.items())
    )
    if labels:
        labels = "{" + labels + "}"
    timestamp = ""
    if sample.timestamp is not None:
        timestamp = f" {int(float(sample.timestamp) * 1000):d}"  # milliseconds
    return f"{sample.name}{labels} {floatToGoString(sample.value)}{timestamp}\n"


def _escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
