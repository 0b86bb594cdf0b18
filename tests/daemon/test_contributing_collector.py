"""CONTRIBUTING.md's "Add a collector" built as written: its collector module and catalog
entry taken from the markdown, the module added to the collector list, a daemon started
from a config and scraped over HTTP."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.daemon.test_daemon_flightstate import mark, rank_recorder

from rankscope import catalog
from rankscope.daemon import cli, collectors, server
from rankscope.daemon.config import DaemonConfig, FlightSection

RECIPE = Path(__file__).resolve().parents[2] / "CONTRIBUTING.md"


def recipe_code() -> list[str]:
    """The python blocks of the section, dedented: the module, then the catalog entry."""
    section = RECIPE.read_text().split("## Add a collector\n")[1].split("\n## ")[0]
    blocks = re.findall(r"^( *)```python\n(.*?)^\1```", section, re.M | re.S)
    return [re.sub(rf"^{indent}", "", code, flags=re.M) for indent, code in blocks]


@pytest.fixture
def example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    module_code, catalog_code = recipe_code()
    (tmp_path / "boots.py").write_text(module_code)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("boots")
    entries = eval(f"[{catalog_code}]", vars(catalog))  # the entry as CATALOG spells it
    monkeypatch.setattr(catalog, "BY_NAME", {**catalog.BY_NAME, **{m.name: m for m in entries}})
    monkeypatch.setattr(collectors, "COLLECTORS", [*collectors.COLLECTORS, module])
    yield module
    sys.modules.pop("boots", None)


def test_the_recipes_collector_is_switched_built_and_scraped(
    example: Any, flight_dir: Path, serve_app: Any
) -> None:
    for boot in ("boot-1", "boot-2"):
        rank_recorder(flight_dir, boot, 0).write_record(mark("weights_loaded"))
    config = DaemonConfig(FlightSection(flight_dir), collectors=frozenset({"boots"}))
    daemon = server.build(config)
    assert [c.name for c in daemon.collectors.collectors] == ["self", "boots"]
    text = serve_app(daemon.app).get("/metrics").text
    samples = {
        (s.name, tuple(s.labels.values())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("rankscope_flight_boots", ())] == 2
    assert samples[("rankscope_collector_success", ("boots",))] == 1

    parser = argparse.ArgumentParser()
    cli.configure_parser(parser, "serve")
    off = cli.build(parser.parse_args([f"--flight.dir={flight_dir}", "--no-collector.boots"]))
    assert "boots" not in {c.name for c in off.collectors.collectors}
    assert "--collector.boots" in parser.format_help()
