"""The mixin: generated files in step with the generator, rules checked and unit-tested by
the real promtool, routing checked by the real amtool, every metric a rule or a panel names
in the catalog, dashboards well formed, docs covering every alert and knob."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.mixin.promql import PromQLSyntaxError, metric_names
from tests.support.services import binary

from rankscope import catalog
from rankscope.daemon.flags import parse_duration
from rankscope.mixin import config, dashboards, render, rules

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"
PROMTOOL_TESTS = sorted((ALERTS / "tests").glob("*.yml"))
AM_EXAMPLE = ALERTS / "alertmanager.example.yml"
SEVERITIES = {"critical", "warning", "info"}
# The alerts whose `for:` is minutes, evaluated every slowAlertsInterval.
SLOW_ALERTS = {
    "RankscopeCorridorThin",
    "RankscopeForeignHolder",
    "RankscopeExporterDown",
    "RankscopeSamplerLagging",
}
# Prometheus's own series that rules and panels may name besides the catalog's.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


# Test-side readers of the mixin's output (not part of the package: only the tests need them).
_LABEL_VALUES = re.compile(r"^\s*label_values\s*\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", re.S)


def variable_query_names(query: str) -> set[str]:
    """Metric names in a Grafana Prometheus variable query: ``label_values(EXPR, label)``,
    ``label_values(label)`` (no metric) or ``query_result(EXPR)``."""
    match = _LABEL_VALUES.match(query)
    if match:
        return metric_names(match.group(1))
    stripped = query.strip()
    if stripped.startswith("label_values("):
        return set()
    if stripped.startswith("query_result(") and stripped.endswith(")"):
        return metric_names(stripped[len("query_result(") : -1])
    return metric_names(query)


def record_names() -> list[str]:
    return [r["record"] for g in rules.build()["groups"] for r in g["rules"] if "record" in r]


def run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


# --- the generated files -------------------------------------------------------------------


def test_generated_files_match_the_generator() -> None:
    stale = render.write(ROOT, check=True)
    assert not stale, f"regenerate with `python3 -m rankscope.mixin`: {stale}"
    shipped = {p.name for p in (ROOT / "dashboards").glob("*.json")}
    assert shipped == set(render.dashboards()), (
        "dashboards/ holds a file the generator does not write"
    )


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    render.write(tmp_path)
    assert render.write(tmp_path, check=True) == []
    (tmp_path / render.RULES_FILE).write_text("groups: []\n")
    assert render.write(tmp_path, check=True) == [tmp_path / render.RULES_FILE]
    own = tmp_path / render.DASHBOARD_DIR / "mine.json"  # a user's own dashboard stays
    own.write_text("{}\n")
    assert render.write(tmp_path, check=True) == [tmp_path / render.RULES_FILE]
    render.write(tmp_path)
    assert own.exists()


def test_config_values_are_pasted_as_text_for_the_helm_sync() -> None:
    ref = "{{ .Values.rules.config.corridorThinShare }}"
    doc = rules.build({"corridorThinShare": ref, "censusSkewFor": "{{ .Values.skewFor }}"})
    by_name = {r.get("alert") or r["record"]: r for g in doc["groups"] for r in g["rules"]}
    assert f"< {ref} * rankscope_corridor_floor_bytes" in by_name["RankscopeCorridorThin"]["expr"]
    assert by_name["RankscopeCensusSkew"]["for"] == "{{ .Values.skewFor }}"
    assert rules.build() == rules.build(config.DEFAULTS)


def test_an_unknown_config_key_is_an_error() -> None:
    with pytest.raises(KeyError, match="corridorThinShar"):
        rules.build({"corridorThinShar": 0.5})


# --- promtool -------------------------------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    result = run(binary("promtool"), "check", "rules", str(ALERTS / "rankscope.rules.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 14 rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    assert PROMTOOL_TESTS, "alerts/tests/*.yml are missing"
    result = run(binary("promtool"), "test", "rules", *map(str, PROMTOOL_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(PROMTOOL_TESTS)


@pytest.mark.parametrize(
    "override",
    [
        {"corridorThinShare": 0.5},
        {"corridorThinFor": "5m"},
        {"censusSkewFor": "30s"},
        {"censusSkewLookback": "1s"},
        {"censusStallSeconds": 600},
        {"censusHangFor": "30s"},
        {"foreignHolderFor": "1m"},
        {"corridorBreachWindow": "10m"},
        {"samplerOverrunShare": 0.2},
        {"exporterDownFor": "10m"},
        {"ncclCountMismatchFor": "30s"},
        {"ncclPeerDeadFor": "1m"},
    ],
    ids=lambda o: next(iter(o)),
)
def test_promtool_unit_tests_pin_the_shipped_values(tmp_path: Path, override: dict) -> None:
    """The unit tests prove the shipped thresholds: the same tests fail on other ones."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "rankscope.rules.yml").write_text(render.rules_yaml(override))
    for test in PROMTOOL_TESTS:
        shutil.copy(test, tmp_path / "tests" / test.name)
    result = run(
        binary("promtool"),
        "test",
        "rules",
        *sorted(str(p) for p in (tmp_path / "tests").glob("*.yml")),
    )
    assert result.returncode != 0, f"promtool tests still pass with {override}"


def _promtool_cases() -> list[dict[str, Any]]:
    cases = []
    for path in PROMTOOL_TESTS:
        cases.extend(yaml.safe_load(path.read_text())["tests"])
    return cases


def test_every_alert_has_a_positive_and_a_negative_promtool_case() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in _promtool_cases():
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - fired == set(), "alerts never shown firing"
    assert names - quiet == set(), "alerts never shown quiet"


def test_every_recording_rule_has_promtool_cases() -> None:
    exprs = " ".join(
        check["expr"] for case in _promtool_cases() for check in case.get("promql_expr_test", [])
    )
    for record in record_names():
        assert record in exprs, f"no promql_expr_test evaluates {record}"


# --- alert conventions ------------------------------------------------------------------------


def _alerts() -> list[dict[str, Any]]:
    return [r for g in rules.build()["groups"] for r in g["rules"] if "alert" in r]


def test_alerts_carry_severity_summary_description_and_runbook() -> None:
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9_-]", "", h.strip().lower().replace(" ", "-"))
        for h in re.findall(r"^#+ (.+)$", runbook, re.M)
    }
    for alert in _alerts():
        assert alert["labels"]["severity"] in SEVERITIES
        notes = alert["annotations"]
        assert "{{" not in notes["summary"], f"{alert['alert']}: the summary must be static"
        assert "{{" in notes["description"], f"{alert['alert']}: the description names nothing"
        url, _, anchor = notes["runbook_url"].partition("#")
        assert url.endswith("docs/runbook.md")
        assert anchor in anchors, f"docs/runbook.md has no section #{anchor}"
    assert {a["alert"] for a in _alerts()} == {
        "RankscopeCorridorBreach",
        "RankscopeCorridorThin",
        "RankscopeCensusSkew",
        "RankscopeCensusHang",
        "RankscopeCensusStalled",
        "RankscopeNcclCountMismatch",
        "RankscopeNcclPeerDead",
        "RankscopeForeignHolder",
        "RankscopeOutOfMemory",
        "RankscopeExporterDown",
        "RankscopeSamplerLagging",
    }


def _seconds(duration: str) -> float:
    return 0.0 if duration == "0s" else parse_duration(duration)


def test_only_alerts_that_wait_minutes_are_evaluated_at_the_slow_interval() -> None:
    """A group evaluated every slowAlertsInterval fires its alerts up to that much after
    their `for:`: only an alert whose `for:` is at least twice the interval goes there, and
    every alert that pages within that stays in the group at the global interval."""
    groups = {g["name"]: g for g in rules.build()["groups"]}
    slow = groups[rules.SLOW_ALERTING_GROUP]
    assert slow["interval"] == config.DEFAULTS["slowAlertsInterval"]
    interval = _seconds(slow["interval"])
    assert {r["alert"] for r in slow["rules"]} == SLOW_ALERTS
    for alert in slow["rules"]:
        assert _seconds(alert["for"]) >= 2 * interval, alert["alert"]
    for alert in groups[rules.ALERTING_GROUP]["rules"]:
        assert _seconds(alert["for"]) < 2 * interval, f"{alert['alert']} could wait longer"
    assert all("interval" not in g for g in groups.values() if g is not slow)
    custom = rules.build({"slowAlertsInterval": "30s"})["groups"]
    assert {g["name"]: g.get("interval") for g in custom}[rules.SLOW_ALERTING_GROUP] == "30s"


def test_alerting_doc_covers_every_config_key() -> None:
    doc = (ROOT / "docs" / "alerting.md").read_text()
    for key in config.DEFAULTS:
        assert f"`{key}`" in doc, f"docs/alerting.md does not document {key}"


# --- metric names: the catalog is the only source -------------------------------------------


def _known_names() -> set[str]:
    names = {n for m in catalog.CATALOG for n in catalog.exposed_names(m)}
    return names | set(record_names()) | PROMETHEUS_SERIES


def unknown_names(expr: str, *, variable: bool = False) -> set[str]:
    names = variable_query_names(expr) if variable else metric_names(expr)
    return names - _known_names()


def _rule_queries() -> list[str]:
    queries = []
    for group in rules.build()["groups"]:
        for rule in group["rules"]:
            queries.append(rule["expr"])
            # Description templates query Prometheus too (printf "metric{...}" | query).
            desc = rule.get("annotations", {}).get("description", "")
            queries.extend(re.findall(r'printf\s+"([^"]*)"', desc))
    return queries


def _panel_queries(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def _variable_queries(board: dict[str, Any]) -> list[str]:
    return [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]


def test_every_rule_names_only_catalog_metrics() -> None:
    queries = _rule_queries()
    assert len(queries) >= 13
    for expr in queries:
        assert unknown_names(expr) == set(), expr


def test_every_panel_and_variable_names_only_catalog_metrics() -> None:
    for name, board in render.dashboards().items():
        for expr in _panel_queries(board):
            assert metric_names(expr), f"{name}: {expr} names no metric"
            assert unknown_names(expr) == set(), f"{name}: {expr}"
        for query in _variable_queries(board):
            assert unknown_names(query, variable=True) == set(), f"{name}: {query}"


def test_the_catalog_check_catches_an_unknown_metric() -> None:
    assert unknown_names('rate(rankscope_gpu_fre_bytes{job="rankscope"}[5m])') == {
        "rankscope_gpu_fre_bytes"
    }
    assert unknown_names("rankscope:corridor_margin") == {"rankscope:corridor_margin"}
    assert unknown_names('label_values(rankscope_bogus{job="x"}, gpu)', variable=True) == {
        "rankscope_bogus"
    }


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('a{job="x", b=~"}{[(a)]"} - b', {"a", "b"}),
        ("sum by (boot, rank) (rate(x_total[5m:30s]))", {"x_total"}),
        ("sum(x) without (instance) / on(boot) group_left(rank, pid) y", {"x", "y"}),
        ("topk by (job, gpu) (1, sum by (gpu, boot) (z))", {"z"}),
        ("max_over_time(m[1h] offset 5m) > bool 1e3 and n unless o or p", {"m", "n", "o", "p"}),
        ("x * 0x1F + .5 - Inf + NaN", {"x"}),
        ('{__name__="hidden", job="x"}', {"hidden"}),
        ("{__name__=~'a|b'}", {"a|b"}),
        ('label_replace(a, "dst", "$1", "src", "(.*)")', {"a"}),
        ('count_values("round", r) @ start()', {"r"}),
        ("rate(x[$__rate_interval]) / ${scale} + $offset", {"x"}),
        (
            'rankscope:census_skew{boot=~"$boot"}  # a comment naming nothing\n + y',
            {
                "rankscope:census_skew",
                "y",
            },
        ),
        ("histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m])))", {"h_bucket"}),
        ("vector(1) + time()", set()),
    ],
)
def test_tokenizer_finds_exactly_the_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


@pytest.mark.parametrize(
    ("query", "names"),
    [
        (
            'label_values(rankscope_gpu_total_bytes{job="r", a="b, c"}, gpu)',
            {"rankscope_gpu_total_bytes"},
        ),
        ("label_values(boot)", set()),
        ("query_result(max by (boot) (rankscope_census_round))", {"rankscope_census_round"}),
    ],
)
def test_variable_queries(query: str, names: set[str]) -> None:
    assert variable_query_names(query) == names


@pytest.mark.parametrize("expr", ['a{job="x}', "a[5m", "'open"])
def test_tokenizer_rejects_unterminated_input(expr: str) -> None:
    with pytest.raises(PromQLSyntaxError):
        metric_names(expr)


# --- dashboards -------------------------------------------------------------------------------


def test_dashboards_are_provisionable() -> None:
    boards = render.dashboards()
    uids = [b["uid"] for b in boards.values()]
    assert len(set(uids)) == len(uids) == 4
    for name, board in boards.items():
        assert name == f"{board['uid']}.json"
        assert board["schemaVersion"] == dashboards.SCHEMA_VERSION
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        assert "instance" in variables, f"{name}: no host variable"
        for var in variables.values():
            if var["type"] == "query":
                assert var["definition"].startswith("label_values(")
                assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        ids = [p["id"] for p in board["panels"]]
        assert len(set(ids)) == len(ids)
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel["targets"] and all(
                t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]
            )
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24
            used = set(re.findall(r"\$(\w+)", " ".join(t["expr"] for t in panel["targets"])))
            assert used - set(variables) - {"__rate_interval"} == set(), f"{name}: {panel['title']}"
    assert {"boot", "gpu"} <= {
        v["name"] for v in boards["rankscope-cards.json"]["templating"]["list"]
    }
    assert {"boot", "gpu"} <= {
        v["name"] for v in boards["rankscope-boot-ledger.json"]["templating"]["list"]
    }
    assert "boot" in {v["name"] for v in boards["rankscope-census.json"]["templating"]["list"]}


# --- Alertmanager routing ---------------------------------------------------------------------


def test_amtool_checks_the_example() -> None:
    result = run(binary("amtool"), "check-config", str(AM_EXAMPLE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    assert "7 inhibit rules" in result.stdout


def amtool_routes(*args: str) -> subprocess.CompletedProcess[str]:
    """`amtool config routes test ARGS` against the example Alertmanager config."""
    return run(binary("amtool"), "config", "routes", "test", f"--config.file={AM_EXAMPLE}", *args)


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (
            ["alertname=RankscopeCorridorBreach", "severity=critical", "gpu=0", "uuid=GPU-a"],
            "rankscope-pager",
        ),
        (["alertname=RankscopeCensusSkew", "severity=critical", "boot=b1"], "rankscope-pager"),
        (
            ["alertname=RankscopeOutOfMemory", "severity=critical", "boot=b1", "uuid=GPU-a"],
            "rankscope-pager",
        ),
        (["alertname=RankscopeOutOfMemory", "severity=critical", "uuid=GPU-a"], "rankscope-pager"),
        (
            ["alertname=RankscopeNcclCountMismatch", "severity=critical", "comm=0x4a93"],
            "rankscope-pager",
        ),
        (["alertname=RankscopeNcclPeerDead", "severity=critical"], "rankscope-pager"),
        (["alertname=RankscopeForeignHolder", "severity=warning", "boot=b1"], "rankscope-tickets"),
        (["alertname=RankscopeSamplerLagging", "severity=warning"], "rankscope-tickets"),
        (["alertname=RankscopeSomethingInfo", "severity=info"], "rankscope-null"),
        (["alertname=NodeDown", "severity=critical"], "rankscope-null"),
    ],
)
def test_amtool_routes(labels: list[str], receiver: str) -> None:
    result = amtool_routes(f"--verify.receivers={receiver}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


def test_every_shipped_alert_routes_by_its_severity() -> None:
    expected = {
        "critical": "rankscope-pager",
        "warning": "rankscope-tickets",
        "info": "rankscope-null",
    }
    for alert in _alerts():
        severity = alert["labels"]["severity"]
        result = amtool_routes(f"alertname={alert['alert']}", f"severity={severity}")
        assert result.stdout.strip() == expected[severity], alert["alert"]


def test_example_inhibitions_name_shipped_alerts() -> None:
    am = yaml.safe_load(AM_EXAMPLE.read_text())
    names = {a["alert"] for a in _alerts()}
    for rule in am["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            match = re.fullmatch(r'alertname="(\w+)"', matcher)
            assert match and match.group(1) in names, matcher
