"""The mixin -> chart sync (rankscope.mixin.helm): its parse and escape functions on fixture
text, and the committed chart files against what it writes now."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rankscope.mixin import config, helm

ROOT = Path(__file__).resolve().parents[2]


def test_escape_wraps_each_prometheus_template() -> None:
    text = "Card {{ $labels.gpu }} at {{ $value | humanize1024 }}B"
    assert helm.escape_prometheus_templates(text) == (
        "Card {{`{{ $labels.gpu }}`}} at {{`{{ $value | humanize1024 }}`}}B"
    )
    multi = 'a {{ with printf "x{a=%q}" $labels.a\n | query }}b{{ end }}'
    assert helm.escape_prometheus_templates(multi) == (
        'a {{`{{ with printf "x{a=%q}" $labels.a\n | query }}`}}b{{`{{ end }}`}}'
    )
    assert helm.escape_prometheus_templates('rate(x{job="a"}[5m])') == 'rate(x{job="a"}[5m])'


@pytest.mark.parametrize("bad", ["{{ `raw` }}", "open {{ $labels.gpu", "close }} only"])
def test_escape_refuses_what_helm_cannot_carry(bad: str) -> None:
    with pytest.raises(ValueError):
        helm.escape_prometheus_templates(bad)


def test_value_reference_prints_numbers_through_the_helper() -> None:
    assert helm.value_reference("selector", 'job="x"') == (
        "{{ .Values.prometheusRule.config.selector }}"
    )
    assert helm.value_reference("share", 0.25) == (
        '{{ include "rankscope.ruleNumber" .Values.prometheusRule.config.share }}'
    )
    with pytest.raises(ValueError, match="identifier"):
        helm.value_reference("not-an-identifier", 1)


def test_template_never_opens_an_action_at_a_promql_brace() -> None:
    template = helm.rule_groups()
    assert "{{{" not in template and "}}}" not in template.replace("}}`}}", "")
    assert "{ {{- .Values.prometheusRule.config.selector -}} }" in template
    # Every config key is referenced, none is left as a literal default.
    for key in config.DEFAULTS:
        assert f".Values.prometheusRule.config.{key} " in template, key


def test_a_reference_in_a_quoted_scalar_is_refused() -> None:
    """Helm would paste a selector's quotes into a double-quoted YAML string and break it."""
    helm.check_reference_styles("expr: |-\n  up{__rankscope_helm_value_selector__}\n")
    helm.check_reference_styles("for: __rankscope_helm_value_censusSkewFor__\n")
    with pytest.raises(ValueError, match="scalar"):
        helm.check_reference_styles('expr: "up{__rankscope_helm_value_selector__}"\n')


def test_key_comments_read_the_block_above_each_key() -> None:
    source = """
DEFAULTS = {
    # Selects the series.
    "selector": 'job="x"',
    # A window and its for:
    # both of one alert.
    "window": "5m",
    "for": "1m",
    "bare": 1,
}
"""
    assert helm.key_comments(source) == {
        "selector": "Selects the series.",
        "window": "A window and its for: both of one alert.",
        "for": "A window and its for: both of one alert.",
        "bare": "A window and its for: both of one alert.",
    }
    assert helm.key_comments('X = 1\n"lonely": 2\n') == {"lonely": ""}


def test_sync_values_replaces_only_the_marked_block() -> None:
    text = (
        "prometheusRule:\n  enabled: false\n"
        f"  {helm.BLOCK_BEGIN} from somewhere\n  config:\n    stale: 1\n  {helm.BLOCK_END}\n"
        "dashboards:\n  enabled: false\n"
    )
    synced = helm.sync_values(text, {"selector": 'job="x"', "corridorThinShare": 0.4})
    assert synced.startswith("prometheusRule:\n  enabled: false\n")
    assert synced.endswith(f"  {helm.BLOCK_END}\ndashboards:\n  enabled: false\n")
    parsed = yaml.safe_load(synced)
    assert parsed["prometheusRule"]["config"] == {"selector": 'job="x"', "corridorThinShare": 0.4}
    with pytest.raises(ValueError, match="marker"):
        helm.sync_values("prometheusRule:\n  enabled: false\n", {})


def test_config_schema_types_and_patterns() -> None:
    node = helm.config_schema(config.DEFAULTS)
    assert node["default"] == config.DEFAULTS and node["additionalProperties"] is False
    for key, default in config.DEFAULTS.items():
        prop = node["properties"][key]
        assert prop["default"] == default and prop["description"]
        if isinstance(default, str) and key.endswith("For"):
            assert prop["pattern"] == helm.DURATION_PATTERN
        if isinstance(default, (int, float)):
            assert prop["type"] == "number" and prop["minimum"] == 0


def test_committed_chart_files_are_what_the_sync_writes() -> None:
    stale = helm.write(ROOT, check=True)
    assert stale == [], f"run python3 -m rankscope.mixin.helm: {stale}"
    chart_copies = sorted(p.name for p in (ROOT / helm.CHART_DASHBOARDS).glob("*.json"))
    repo = sorted(p.name for p in (ROOT / "dashboards").glob("*.json"))
    assert chart_copies == repo
    for name in repo:
        assert (ROOT / helm.CHART_DASHBOARDS / name).read_bytes() == (
            ROOT / "dashboards" / name
        ).read_bytes()


def test_sync_restores_a_stale_chart(tmp_path: Path) -> None:
    """Run as a module on a copy of the chart with a hand-edited template, a stale value
    block and a dashboard the mixin no longer makes: it reports, then repairs, all three."""
    shutil.copytree(ROOT / helm.CHART, tmp_path / helm.CHART)
    template = tmp_path / helm.RULE_TEMPLATE
    template.write_text(template.read_text().replace("severity: critical", "severity: info"))
    values = tmp_path / helm.VALUES_FILE
    values.write_text(values.read_text().replace("corridorThinShare: 0.25", "corridorThinShare: 9"))
    orphan = tmp_path / helm.CHART_DASHBOARDS / "gone.json"
    orphan.write_text("{}\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rankscope.mixin.helm", *args, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )

    check = run("--check")
    assert check.returncode == 1
    assert {Path(line.split(" ", 1)[1]) for line in check.stdout.splitlines()} == {
        template,
        values,
        orphan,
    }
    assert run().returncode == 0
    assert not orphan.exists()
    assert run("--check").returncode == 0
    assert template.read_text() == (ROOT / helm.RULE_TEMPLATE).read_text()
    assert values.read_text() == (ROOT / helm.VALUES_FILE).read_text()
