"""The collector protocol: families made from the catalog, the timing wrapper, and a failing
collector that costs only its own families."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from rankscope import catalog
from rankscope.daemon.registry import (
    Collector,
    TimedCollectors,
    add,
    counter,
    family,
    gauge,
    info,
    label_values,
    summary,
)


def test_every_catalog_entry_makes_a_family_with_its_help_type_and_labels() -> None:
    for m in catalog.CATALOG:
        fam = family(m.name)
        assert fam.documentation == m.help
        assert fam.type == m.type, m.name
        assert fam.name == m.family


def test_typed_helpers_refuse_the_wrong_kind_and_unknown_names() -> None:
    assert gauge("rankscope_gpu_free_bytes").type == "gauge"
    assert counter("rankscope_collectives_total").name == "rankscope_collectives"
    assert summary("rankscope_sampler_duration_seconds").type == "summary"
    assert info("rankscope_build_info").name == "rankscope_build"
    with pytest.raises(TypeError, match="counter in the catalog"):
        gauge("rankscope_collectives_total")
    with pytest.raises(KeyError):
        family("rankscope_not_in_the_catalog")


def test_add_leaves_an_unmeasured_value_out_and_empties_unknown_labels() -> None:
    fam = gauge("rankscope_gpu_free_bytes")
    add(fam, (0, "GPU-a"), None)
    add(fam, (1, None), 5)
    assert [(s.labels, s.value) for s in fam.samples] == [({"gpu": "1", "uuid": ""}, 5.0)]
    assert label_values(None, 3, "x") == ["", "3", "x"]


def _fixed(name: str, value: float) -> Collector:
    def collect() -> Iterator[Metric]:
        fam = gauge("rankscope_gpu_free_bytes")
        fam.add_metric(["0", "GPU-a"], value)
        yield fam

    return Collector(name, collect)


def _broken() -> Iterator[Metric]:
    yield gauge("rankscope_gpu_total_bytes")
    raise RuntimeError("NVML fell off the bus")


def _scrape(timed: TimedCollectors) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = generate_latest(timed.registry()).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_a_failing_collector_costs_its_own_families_and_is_reported() -> None:
    timed = TimedCollectors([Collector("broken", _broken), _fixed("cards", 7.0)])
    samples = _scrape(timed)
    assert samples["rankscope_gpu_free_bytes"] == [({"gpu": "0", "uuid": "GPU-a"}, 7.0)]
    # The half-built family of the broken collector is not exposed.
    assert "rankscope_gpu_total_bytes" not in samples
    success = {labels["collector"]: v for labels, v in samples["rankscope_collector_success"]}
    assert success == {"broken": 0.0, "cards": 1.0}
    durations = {
        labels["collector"]: v for labels, v in samples["rankscope_collector_duration_seconds"]
    }
    assert set(durations) == {"broken", "cards"}
    assert all(d >= 0 for d in durations.values())


def test_collector_names_are_unique() -> None:
    with pytest.raises(ValueError, match="two collectors named 'cards'"):
        TimedCollectors([_fixed("cards", 1), _fixed("cards", 2)])
