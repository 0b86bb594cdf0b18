"""The Helm chart (helm/rankscope), rendered and linted by Helm's own engine.

helm-python-sdk binds Helm's Go SDK (v4), so rendering, values.schema.json validation and
lint are Helm's, with no helm binary. Rendered core objects are checked against the
Kubernetes schemas (kubernetes-validate, strict), the ServiceMonitor, PodMonitor and
PrometheusRule against the Prometheus Operator's API schemas (the npm package
@kubernetes-models/prometheus-operator, run by node), the PrometheusRule's rules against the
mixin and by promtool, the container args by the daemon's own parser, and the daemon itself
is started with the args and web config the chart renders and probed as the kubelet would.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import helm_python as helm
import kubernetes_validate
import pytest
import tomllib
import yaml
from prometheus_client.parser import text_string_to_metric_families

import rankscope
from rankscope.cli import build_parser
from rankscope.daemon import cli as daemon_cli
from rankscope.daemon import collectors
from rankscope.daemon.webconfig import parse_web_config
from rankscope.mixin import config as mixin_config
from rankscope.mixin import render as mixin_render
from rankscope.mixin import rules as mixin_rules
from support.services import binary, free_port, prometheus, stop

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "rankscope"
RELEASE, NAMESPACE = "rs", "gpu"
# Where scripts/test.sh installs the Prometheus Operator's API schemas (npm, into build/).
CRD_MODELS = (
    Path(os.environ.get("RANKSCOPE_CRD_MODELS", ROOT / "build" / "crd-schemas"))
    / "node_modules"
    / "@kubernetes-models"
    / "prometheus-operator"
)
CRD_INSTALL = (
    "npm install --no-audit --no-fund --prefix build/crd-schemas "
    "@kubernetes-models/prometheus-operator@6.0.0"
)

PASSWORD = "scrape-me"
BCRYPT_HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
UUID = "GPU-3f0e1c2a-8b1d-4e5f-9a7b-0c1d2e3f4a5b"

ALL_ON: dict[str, Any] = {
    "service": {"enabled": True, "annotations": {"team": "serving"}},
    "serviceMonitor": {
        "enabled": True,
        "labels": {"release": "kube-prometheus-stack"},
        "interval": "30s",
        "scrapeTimeout": "10s",
        "jobLabel": "app.kubernetes.io/name",
        "tlsConfig": {
            "ca": {"secret": {"name": "rankscope-ca", "key": "ca.crt"}},
            "serverName": "rankscope",
        },
        "basicAuth": {
            "username": {"name": "rankscope-scrape", "key": "username"},
            "password": {"name": "rankscope-scrape", "key": "password"},
        },
        "metricRelabelings": [
            {"action": "drop", "sourceLabels": ["__name__"], "regex": "rankscope_build_info"}
        ],
    },
    "podMonitor": {
        "enabled": True,
        "labels": {"release": "kube-prometheus-stack"},
        "interval": "15s",
        "scrapeTimeout": "5s",
        "tlsConfig": {"insecureSkipVerify": True},
        "basicAuth": {
            "username": {"name": "rankscope-scrape", "key": "username"},
            "password": {"name": "rankscope-scrape", "key": "password"},
        },
    },
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "dashboards": {"enabled": True, "annotations": {"grafana_folder": "GPU"}},
    "webConfig": {
        "tls": {"enabled": True, "secretName": "rankscope-tls", "minVersion": "TLS12"},
        "basicAuthUsers": {"prometheus": BCRYPT_HASH},
    },
    "corridor": {"defaultFloor": "5%", "floors": {"0": "2GiB", "1": 1610612736, UUID: "1.5GB"}},
    "sampler": {"interval": "250ms", "window": "30s"},
    "holdings": {"interval": "2s", "maxPerCard": 8},
    "collectors": {"census": False, "holdings": True},
    "attribution": {"ptrace": True},
    "extraArgs": ["--log.level=debug"],
    "extraEnv": [{"name": "OTEL_SERVICE_NAME", "value": "rankscope"}],
    "extraVolumes": [{"name": "scratch", "emptyDir": {}}],
    "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    "priorityClassName": "system-node-critical",
    "imagePullSecrets": [{"name": "registry"}],
    "image": {"registry": "registry.example", "digest": "sha256:" + "ab" * 32},
    "podAnnotations": {"example/owner": "gpu-team"},
    "commonLabels": {"cost-center": "inference"},
}

# --- rendering --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    loaded = helm.Chart.load(CHART)
    try:
        yield loaded
    finally:
        loaded.close()


def render(chart: helm.Chart, values: dict[str, Any] | None = None) -> dict[str, str]:
    return chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)


def objects(chart: helm.Chart, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every rendered object (NOTES.txt is text, not an object)."""
    found = []
    for path, text in render(chart, values).items():
        if path.endswith("NOTES.txt"):
            continue
        found.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return found


def one(found: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matches = [o for o in found if o["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, got {len(matches)}"
    return matches[0]


def container(found: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(found, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def web_config_text(found: list[dict[str, Any]]) -> str:
    return str(one(found, "Secret")["stringData"]["web-config.yml"])


# --- lint, kinds, schemas ---------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, ALL_ON], ids=["defaults", "all-on"])
def test_lint_is_clean(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


def test_defaults_render_the_daemon_only(chart: helm.Chart) -> None:
    kinds = sorted(o["kind"] for o in objects(chart))
    assert kinds == ["DaemonSet", "ServiceAccount"]


def test_every_optional_part_renders(chart: helm.Chart) -> None:
    kinds = sorted(o["kind"] for o in objects(chart, ALL_ON))
    dashboards = len(mixin_render.dashboards())
    assert kinds == sorted(
        ["DaemonSet", "ServiceAccount", "Service", "ServiceMonitor", "PodMonitor"]
        + ["PrometheusRule", "Secret"]
        + ["ConfigMap"] * dashboards
    )


def kube_versions() -> list[str]:
    """The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest
    kubernetes-validate knows."""
    declared = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    oldest = re.search(r"(\d+\.\d+\.\d+)", declared)
    assert oldest is not None, declared
    return [oldest.group(1), kubernetes_validate.latest_version()]


@pytest.mark.parametrize("values", [{}, ALL_ON], ids=["defaults", "all-on"])
def test_core_objects_match_the_kubernetes_schemas(
    chart: helm.Chart, values: dict[str, Any]
) -> None:
    core = [o for o in objects(chart, values) if "monitoring.coreos.com" not in o["apiVersion"]]
    for version in kube_versions():
        for obj in core:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']} on {version}: {exc}")


def test_the_kubernetes_validator_is_live(chart: helm.Chart) -> None:
    """The strict schemas refuse a DaemonSet with a field of the wrong type and one with a
    field Kubernetes does not know, so a pass above means something."""
    daemonset = one(objects(chart), "DaemonSet")
    wrong_type = copy.deepcopy(daemonset)
    wrong_type["spec"]["template"]["spec"]["hostPID"] = "yes"
    unknown = copy.deepcopy(daemonset)
    unknown["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    for broken in (wrong_type, unknown):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


# The Prometheus Operator's API schemas, compiled to validators by @kubernetes-models.
_CRD_CHECK = """
import { pathToFileURL } from "node:url";
const models = await import(pathToFileURL(process.argv[2] + "/monitoring.coreos.com/v1/index.js"));
let input = "";
for await (const chunk of process.stdin) input += chunk;
const results = JSON.parse(input).map((obj) => {
  const Model = models[obj.kind];
  if (!Model) return `no model for kind ${obj.kind}`;
  try { new Model(obj).validate(); return null; } catch (e) { return String(e.message); }
});
console.log(JSON.stringify(results));
"""


def validate_monitoring(objs: list[dict[str, Any]], tmp_path: Path) -> list[str | None]:
    if not (CRD_MODELS / "package.json").is_file():
        pytest.fail(
            f"the Prometheus Operator schemas are not installed at {CRD_MODELS}: {CRD_INSTALL}"
        )
    script = tmp_path / "crd_check.mjs"
    script.write_text(_CRD_CHECK)
    done = subprocess.run(
        [binary("node", "nodejs"), str(script), str(CRD_MODELS)],
        input=json.dumps(objs),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    results: list[str | None] = json.loads(done.stdout)
    return results


def test_monitors_and_rules_match_the_prometheus_operator_schemas(
    chart: helm.Chart, tmp_path: Path
) -> None:
    found = objects(chart, ALL_ON)
    monitoring = [o for o in found if o["apiVersion"] == "monitoring.coreos.com/v1"]
    assert sorted(o["kind"] for o in monitoring) == [
        "PodMonitor",
        "PrometheusRule",
        "ServiceMonitor",
    ]
    # The same validators must refuse what the operator's API refuses, or a pass is empty.
    bad_interval = copy.deepcopy(one(found, "ServiceMonitor"))
    bad_interval["spec"]["endpoints"][0]["interval"] = "30 seconds"
    bad_for = copy.deepcopy(one(found, "PrometheusRule"))
    bad_for["spec"]["groups"][1]["rules"][0]["for"] = "-5m"
    no_selector = copy.deepcopy(one(found, "PodMonitor"))
    del no_selector["spec"]["selector"]
    results = validate_monitoring([*monitoring, bad_interval, bad_for, no_selector], tmp_path)
    assert results[: len(monitoring)] == [None] * len(monitoring), results
    assert all(results[len(monitoring) :]), results
    assert (
        "interval" in str(results[-3])
        and "for" in str(results[-2])
        and "selector" in str(results[-1])
    )


# --- the PrometheusRule: the mixin's rules, escaped --------------------------------------


def rendered_groups(chart: helm.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    rule = one(
        objects(
            chart,
            {**values, "prometheusRule": {**values.get("prometheusRule", {}), "enabled": True}},
        ),
        "PrometheusRule",
    )
    return list(rule["spec"]["groups"])


def assert_promtool_accepts(groups: list[dict[str, Any]], rule_file: Path) -> None:
    rule_file.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    done = subprocess.run(
        [binary("promtool"), "check", "rules", str(rule_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheusrule_equals_the_mixin_and_alerts_dir(chart: helm.Chart, tmp_path: Path) -> None:
    groups = rendered_groups(chart, {})
    assert groups == mixin_rules.build()["groups"]
    committed = yaml.safe_load((ROOT / "alerts" / "rankscope.rules.yml").read_text())
    assert groups == committed["groups"]
    # Prometheus's own templates came through Helm intact...
    descriptions = [
        r["annotations"]["description"] for g in groups for r in g["rules"] if "alert" in r
    ]
    assert any("{{ $labels.gpu }}" in d for d in descriptions)
    # ...and Prometheus accepts the rendered rules.
    assert_promtool_accepts(groups, tmp_path / "rendered.rules.yml")


def test_prometheusrule_thresholds_are_values(chart: helm.Chart, tmp_path: Path) -> None:
    overrides = {
        "selector": 'job="gpu-rankscope", namespace="gpu"',
        "runbookUrl": "https://runbooks.example/rankscope.html",
        "corridorThinShare": 0.4,
        "corridorBreachFor": "30s",
        "censusStallSeconds": 600,
        "foreignHolderMinBytes": 1073741824,
    }
    groups = rendered_groups(chart, {"prometheusRule": {"config": overrides}})
    assert groups == mixin_rules.build(overrides)["groups"]
    assert groups != mixin_rules.build()["groups"]
    assert_promtool_accepts(groups, tmp_path / "overridden.rules.yml")


def test_rule_values_default_to_the_mixin_config(chart: helm.Chart) -> None:
    assert chart.values["prometheusRule"]["config"] == mixin_config.DEFAULTS


# --- dashboards ----------------------------------------------------------------------------


def test_dashboards_equal_the_mixin_and_dashboards_dir(chart: helm.Chart) -> None:
    maps = [o for o in objects(chart, ALL_ON) if o["kind"] == "ConfigMap"]
    rendered: dict[str, Any] = {}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}
        assert cm["metadata"]["namespace"] == NAMESPACE
        ((name, text),) = cm["data"].items()
        rendered[name] = json.loads(text)
    assert rendered == mixin_render.dashboards()
    committed = {p.name: json.loads(p.read_text()) for p in (ROOT / "dashboards").glob("*.json")}
    assert rendered == committed


def test_dashboard_label_and_namespace_are_values(chart: helm.Chart) -> None:
    values = {
        "dashboards": {
            "enabled": True,
            "label": "grafana_dashboard_rankscope",
            "labelValue": "yes",
            "namespace": "monitoring",
        }
    }
    maps = [o for o in objects(chart, values) if o["kind"] == "ConfigMap"]
    assert maps and all(
        cm["metadata"]["labels"]["grafana_dashboard_rankscope"] == "yes"
        and cm["metadata"]["namespace"] == "monitoring"
        for cm in maps
    )


# --- values.schema.json ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "where", "bad"),
    [
        ({"corridor": {"floors": {"0": "2 parsecs"}}}, "/corridor/floors/0", "2 parsecs"),
        ({"corridor": {"floors": {"1": "-2GiB"}}}, "/corridor/floors/1", "-2GiB"),
        ({"corridor": {"defaultFloor": "lots"}}, "/corridor/defaultFloor", "lots"),
        ({"corridor": {"floors": {"0,1": "2GiB"}}}, "/corridor/floors", "0,1"),
        ({"sampler": {"interval": "-100ms"}}, "/sampler/interval", "-100ms"),
        ({"sampler": {"interval": "0s"}}, "/sampler/interval", "0s"),
        ({"holdings": {"interval": "-1s"}}, "/holdings/interval", "-1s"),
        ({"serviceMonitor": {"interval": "-30s"}}, "/serviceMonitor/interval", "-30s"),
        (
            {"webConfig": {"basicAuthUsers": {"prometheus": "plaintext"}}},
            "/webConfig/basicAuthUsers/prometheus",
            "plaintext",
        ),
        ({"collectors": {"gpus": True}}, "/collectors", "gpus"),
        ({"corridor": {"floors": {"0": -5}}}, "/corridor/floors/0", "-5"),
        ({"port": 70000}, "/port", "70,000"),
    ],
)
def test_schema_refuses_bad_values_at_render_time(
    chart: helm.Chart, values: dict[str, Any], where: str, bad: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        render(chart, values)
    message = str(refused.value)
    assert f"at '{where}'" in message and bad in message, message


def test_schema_accepts_what_the_daemon_accepts(chart: helm.Chart) -> None:
    values = {
        "corridor": {
            "defaultFloor": "2.5%",
            "floors": {
                "0": "2GiB",
                "1": "1536MiB",
                "2": 1073741824,
                "3": "1.5GB",
                "4": "512Mi",
                UUID: "100%",
            },
        },
        "sampler": {"interval": "1m30s"},
    }
    args = container(objects(chart, values))["args"]
    parsed = build_parser(args).parse_args(args)
    floors = parsed.corridor_floor[0]
    assert floors.by_card["0"].bytes == 2 * 1024**3 and floors.by_card["2"].bytes == 1073741824
    assert floors.by_card[UUID].fraction == 1.0 and floors.by_card[""].fraction == 0.025
    assert parsed.sampler_interval == 90.0


def schema_node(schema: dict[str, Any], path: list[str]) -> dict[str, Any]:
    node = schema
    for key in path:
        node = node["properties"][key]
    return node


def walk_values(
    values: dict[str, Any], schema: dict[str, Any], path: list[str]
) -> Iterator[tuple[list[str], Any, dict[str, Any]]]:
    for key, value in values.items():
        node = schema["properties"].get(key)
        assert node is not None, f"values.yaml {'.'.join([*path, key])} has no schema entry"
        yield [*path, key], value, node
        if isinstance(value, dict) and "properties" in node:
            yield from walk_values(value, node, [*path, key])


def test_schema_describes_every_value_with_its_default() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    seen = 0
    for path, value, node in walk_values(values, schema, []):
        name = ".".join(path)
        assert node.get("description"), f"{name}: no description"
        assert "default" in node and node["default"] == value, (
            f"{name}: default {node.get('default')!r} != {value!r}"
        )
        seen += 1
    assert seen > 50

    def every_property(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for key, child in node.get("properties", {}).items():
            yield f"{path}{key}", child
            yield from every_property(child, f"{path}{key}.")

    for name, node in every_property(schema, ""):
        assert node.get("description") and "default" in node, (
            f"schema {name}: description and default"
        )


def test_values_comments_are_the_schema_descriptions() -> None:
    """values.yaml's `# --` comments and the schema's descriptions say the same."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    checked = 0
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending.append(stripped[4:].strip())
            continue
        key = re.match(r"^( *)([A-Za-z0-9_]+):", line)
        if key is None:
            if not stripped.startswith("#"):
                pending = []
            continue
        indent = len(key.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key.group(2)))
        if pending:
            path = [k for _, k in stack]
            assert schema_node(schema, path)["description"] == " ".join(pending), ".".join(path)
            checked += 1
        pending = []
    assert checked > 50


# --- the daemon the chart runs -------------------------------------------------------------


def test_args_are_the_daemons_own_defaults(chart: helm.Chart) -> None:
    args = container(objects(chart))["args"]
    assert args[0] == "serve"
    parsed = build_parser(args).parse_args(args)
    defaults = build_parser(["serve"]).parse_args(["serve", "--flight-dir=/x"])
    for name in (
        "sampler_interval",
        "sampler_window",
        "holdings_interval",
        "holdings_max_per_card",
    ):
        assert getattr(parsed, name) == getattr(defaults, name), name
    assert parsed.corridor_floor is None and parsed.web_config_file is None
    assert daemon_cli.parse_listen_address(parsed.listen_address) == (
        "0.0.0.0",
        chart.values["port"],
    )


def test_all_on_args_parse_as_set(chart: helm.Chart) -> None:
    found = objects(chart, ALL_ON)
    args = container(found)["args"]
    parsed = build_parser(args).parse_args(args)
    # A large number from the values stays digits, as a person would write the flag.
    assert f"--corridor.floor=5%,0=2GiB,1=1610612736,{UUID}=1.5GB" in args
    floors = parsed.corridor_floor[0]
    assert floors.by_card[""].fraction == 0.05
    assert floors.by_card["0"].bytes == 2 * 1024**3 and floors.by_card["1"].bytes == 1610612736
    assert floors.by_card[UUID].bytes == 1_500_000_000
    assert (parsed.sampler_interval, parsed.sampler_window) == (0.25, 30.0)
    assert (parsed.holdings_interval, parsed.holdings_max_per_card) == (2.0, 8)
    assert parsed.collector_census is False and parsed.collector_holdings is True
    assert parsed.log_level == "debug"
    assert parsed.web_config_file == "/etc/rankscope/web/web-config.yml"
    web = parse_web_config(web_config_text(found), Path("/etc/rankscope/web"))
    assert web.tls is not None and web.tls.cert_file == Path("/etc/rankscope/tls/tls.crt")
    assert set(web.users) == {"prometheus"} and bcrypt.checkpw(
        PASSWORD.encode(), web.users["prometheus"]
    )
    # Every collector the daemon can switch off has a value, and no other (nccl-ras has a
    # section of its own, ncclRas, with its addresses).
    schema = json.loads((CHART / "values.schema.json").read_text())
    switches = set(schema["properties"]["collectors"]["properties"])
    switchable = {m.NAME for m in collectors.COLLECTORS if m.DEFAULT is not None} - {"nccl-ras"}
    assert switches == switchable


def test_nccl_ras_is_off_by_default_and_passes_its_flags_when_enabled(chart: helm.Chart) -> None:
    default = container(objects(chart))
    assert not any("nccl-ras" in a for a in default["args"])
    assert "HOST_IP" not in {e["name"] for e in default["env"]}
    found = container(
        objects(
            chart,
            {
                "ncclRas": {
                    "enabled": True,
                    "addresses": ["$(HOST_IP):28028", "$(HOST_IP):28029"],
                    "interval": "30s",
                }
            },
        )
    )
    args = found["args"]
    parsed = build_parser(args).parse_args(args)
    assert parsed.collector_nccl_ras is True
    assert parsed.nccl_ras_address == ["$(HOST_IP):28028", "$(HOST_IP):28029"]
    assert parsed.nccl_ras_interval == 30.0
    # The kubelet expands $(HOST_IP) in args from this env entry.
    (host_ip,) = [e for e in found["env"] if e["name"] == "HOST_IP"]
    assert host_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    with pytest.raises(helm.HelmValuesError):
        render(chart, {"ncclRas": {"enabled": True, "interval": "soon"}})


# --- privilege -------------------------------------------------------------------------------


def test_default_privilege_is_minimal(chart: helm.Chart) -> None:
    found = objects(chart)
    pod = one(found, "DaemonSet")["spec"]["template"]["spec"]
    main = container(found)
    assert pod["hostPID"] is True and "hostNetwork" not in pod and "hostIPC" not in pod
    assert (
        pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    )
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False
    # NVML through the runtime, without taking a card from the ranks.
    assert pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert not any("nvidia.com" in k for part in main["resources"].values() for k in part)
    assert main["resources"]["requests"]["cpu"] and main["resources"]["limits"]["memory"]
    flight = next(m for m in main["volumeMounts"] if m["name"] == "flight")
    assert flight["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == "flight")
    assert volume["hostPath"] == {"path": "/var/lib/rankscope/flight", "type": "DirectoryOrCreate"}


def test_ptrace_is_opt_in_and_adds_only_sys_ptrace(chart: helm.Chart) -> None:
    found = objects(chart, {"attribution": {"ptrace": True}})
    pod = one(found, "DaemonSet")["spec"]["template"]["spec"]
    main = container(found)
    assert (
        pod["securityContext"]["runAsUser"] == 0 and pod["securityContext"]["runAsNonRoot"] is False
    )
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert main["securityContext"]["readOnlyRootFilesystem"] is True


# --- probes and scrapes ---------------------------------------------------------------------


def test_probes_follow_the_web_config(chart: helm.Chart) -> None:
    plain = container(objects(chart))
    assert plain["livenessProbe"]["httpGet"] == {
        "path": "/healthz",
        "port": "http-metrics",
        "scheme": "HTTP",
    }
    assert plain["readinessProbe"]["httpGet"] == {
        "path": "/readyz",
        "port": "http-metrics",
        "scheme": "HTTP",
    }
    tls = container(objects(chart, {"webConfig": {"tls": {"enabled": True, "secretName": "t"}}}))
    assert tls["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    authed = container(objects(chart, {"webConfig": {"basicAuthUsers": {"p": BCRYPT_HASH}}}))
    assert (
        authed["livenessProbe"]["tcpSocket"] == {"port": "http-metrics"}
        and "httpGet" not in authed["livenessProbe"]
    )


def test_monitors_scrape_with_tls_and_basic_auth(chart: helm.Chart) -> None:
    found = objects(chart, ALL_ON)
    endpoint = one(found, "ServiceMonitor")["spec"]["endpoints"][0]
    assert (
        endpoint["scheme"] == "https"
        and endpoint["interval"] == "30s"
        and endpoint["scrapeTimeout"] == "10s"
    )
    assert endpoint["basicAuth"] == ALL_ON["serviceMonitor"]["basicAuth"]
    assert endpoint["tlsConfig"] == ALL_ON["serviceMonitor"]["tlsConfig"]
    assert [r["targetLabel"] for r in endpoint["relabelings"]] == ["job", "node"]
    pod_endpoint = one(found, "PodMonitor")["spec"]["podMetricsEndpoints"][0]
    assert pod_endpoint["port"] == "http-metrics" and pod_endpoint["scheme"] == "https"
    service = one(found, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == one(found, "DaemonSet")["spec"]["selector"]["matchLabels"]
    assert (
        one(found, "ServiceMonitor")["spec"]["selector"]["matchLabels"].items()
        <= service["metadata"]["labels"].items()
    )


def test_an_existing_web_config_secret_is_mounted_as_is(chart: helm.Chart) -> None:
    values = {
        "webConfig": {
            "existingSecret": "my-web-config",
            "existingSecretKey": "config.yml",
            "tls": {"enabled": True, "secretName": "my-tls"},
            "basicAuthUsers": {"ignored": BCRYPT_HASH},
        }
    }
    found = objects(chart, values)
    assert not [o for o in found if o["kind"] == "Secret"]
    pod = one(found, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["web-config"]["secret"] == {"secretName": "my-web-config"}
    assert volumes["tls"]["secret"] == {"secretName": "my-tls"}
    main = container(found)
    assert "--web.config.file=/etc/rankscope/web/config.yml" in main["args"]
    # The chart cannot see whether that file asks for basic auth: the probes stay TCP.
    assert "tcpSocket" in main["livenessProbe"] and "tcpSocket" in main["readinessProbe"]


def test_monitors_give_the_job_the_rules_select(chart: helm.Chart) -> None:
    """Both monitors set the job label the mixin's default selector names, so the rules
    see the scraped series without any other setting."""
    found = objects(chart, {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}})
    endpoints = [
        one(found, "ServiceMonitor")["spec"]["endpoints"][0],
        one(found, "PodMonitor")["spec"]["podMetricsEndpoints"][0],
    ]
    for endpoint in endpoints:
        (job,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
        assert mixin_config.DEFAULTS["selector"] == f'job="{job["replacement"]}"'


def test_web_config_needs_its_tls_secret(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"webConfig\.tls\.secretName"):
        render(chart, {"webConfig": {"tls": {"enabled": True}}})


def test_notes_say_how_to_reach_the_metrics(chart: helm.Chart) -> None:
    notes = render(chart)["rankscope/templates/NOTES.txt"]
    assert f"port-forward pod/POD_NAME {chart.values['port']}" in notes
    assert f"http://127.0.0.1:{chart.values['port']}/metrics" in notes
    notes_on = render(chart, ALL_ON)["rankscope/templates/NOTES.txt"]
    assert "https://127.0.0.1" in notes_on and "--user USER" in notes_on
    assert (
        "ServiceMonitor gpu/rs-rankscope" in notes_on
        and "release=kube-prometheus-stack" in notes_on
    )


def test_app_version_is_the_package_version() -> None:
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    # The package's version has one source, rankscope.__version__, which pyproject.toml reads.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "rankscope.__version__"
    }
    assert chart_meta["appVersion"] == rankscope.__version__


def _openssl_cert(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        [binary("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def _pod_args(args: list[str], replace: dict[str, str]) -> list[str]:
    """The rendered args with the pod's paths and port swapped for this machine's."""
    out = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        out.append(f"{flag}={replace[flag]}" if flag in replace else arg)
    return out


@dataclass
class Pod:
    """`rankscope serve` running as the rendered pod would, on this machine."""

    port: int
    ca_file: Path
    container: dict[str, Any]


# Three SIMULATED cards (there is no GPU here): the first named by the UUID of ALL_ON's
# floors, the other two by index and by nothing (the default floor).
CARDS = [
    {"index": 0, "uuid": UUID, "total": "80GiB", "free": "60GiB"},
    {"index": 1, "uuid": "GPU-simulated-1", "total": "80GiB", "free": "60GiB"},
    {"index": 2, "uuid": "GPU-simulated-2", "total": "80GiB", "free": "60GiB"},
]


@contextlib.contextmanager
def serving(
    args: list[str], tmp_path: Path, cards: list[dict[str, Any]], **paths: str
) -> Iterator[int]:
    """`rankscope serve` with the rendered ``args``, the pod's port, flight directory and
    ``paths`` (flag -> path) swapped for temporary ones, and the daemon's SIMULATED device
    source in place of NVML; yields its port."""
    flight = tmp_path / "flight"
    flight.mkdir()
    script = tmp_path / "cards.json"
    script.write_text(json.dumps({"cards": cards}))
    port = free_port()
    replace = {"--web.listen-address": f"127.0.0.1:{port}", "--flight-dir": str(flight), **paths}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankscope", *_pod_args(args, replace), f"--device.script={script}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_tcp(port, proc)
        yield port
    finally:
        stop(proc, grace=10)


@contextlib.contextmanager
def running_pod(
    found: list[dict[str, Any]], tmp_path: Path, cards: list[dict[str, Any]]
) -> Iterator[Pod]:
    """The daemon as the rendered pod runs it, its web config (TLS and basic auth) included."""
    main = container(found)
    web_dir = tmp_path / "web"
    web_dir.mkdir(parents=True)
    cert, _ = _openssl_cert(tmp_path)
    web_config = web_dir / "web-config.yml"
    web_config.write_text(web_config_text(found).replace("/etc/rankscope/tls/", f"{tmp_path}/"))
    paths = {"--web.config.file": str(web_config)}
    with serving(main["args"], tmp_path, cards, **paths) as port:
        yield Pod(port=port, ca_file=cert, container=main)


def test_the_daemon_runs_with_what_the_chart_renders(chart: helm.Chart, tmp_path: Path) -> None:
    """`rankscope serve` started with the rendered args and web config answers the probes
    the chart sets (as the kubelet sends them) and serves /metrics to the credentials the
    monitors use, with the floors of the values."""
    with running_pod(objects(chart, ALL_ON), tmp_path, CARDS) as pod:
        context = ssl.create_default_context(cafile=str(pod.ca_file))
        auth = "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()

        def get(path: str, authorization: str | None = auth) -> tuple[int, bytes]:
            request = urllib.request.Request(f"https://127.0.0.1:{pod.port}{path}")
            if authorization:
                request.add_header("Authorization", authorization)
            try:
                with urllib.request.urlopen(request, timeout=5, context=context) as resp:
                    return resp.status, resp.read()
            except urllib.error.HTTPError as err:
                return err.code, b""

        for probe in ("livenessProbe", "readinessProbe"):
            assert kubelet_probe(pod.container[probe], pod.port, context), probe
        status, body = get("/metrics")
        assert status == 200
        floors = {
            s.labels["uuid"]: s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples
            if s.name == "rankscope_corridor_floor_bytes"
        }
        # By uuid (which wins over index 0), by index, and the default share of the total.
        assert floors == {
            UUID: 1_500_000_000,
            "GPU-simulated-1": 1610612736,
            "GPU-simulated-2": round(0.05 * 80 * 1024**3),
        }
        assert get("/metrics", None)[0] == 401


def _snake(key: str) -> str:
    return re.sub(r"(?<=[a-z])([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def scrape_config(monitor: dict[str, Any], pod: Pod) -> dict[str, Any]:
    """The Prometheus scrape job the Prometheus Operator makes of the rendered
    ServiceMonitor's endpoint, aimed at the pod on loopback: scheme, basic auth (the
    Secret's password), TLS (the CA), relabelings and metric relabelings in snake case."""
    endpoint = monitor["spec"]["endpoints"][0]
    meta = monitor["metadata"]
    return {
        "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/0",
        "scheme": endpoint["scheme"],
        "metrics_path": endpoint["path"],
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "honor_labels": endpoint["honorLabels"],
        "basic_auth": {"username": "prometheus", "password": PASSWORD},
        "tls_config": {"ca_file": str(pod.ca_file), "server_name": "127.0.0.1"},
        "static_configs": [{"targets": [f"127.0.0.1:{pod.port}"]}],
        "relabel_configs": [
            {_snake(k): v for k, v in r.items()} for r in endpoint.get("relabelings", [])
        ],
        "metric_relabel_configs": [
            {_snake(k): v for k, v in r.items()} for r in endpoint.get("metricRelabelings", [])
        ],
    }


def test_prometheus_scrapes_the_pod_and_the_rules_page(chart: helm.Chart, tmp_path: Path) -> None:
    """The rendered ServiceMonitor (as a scrape job), PrometheusRule (as a rule file) and
    DaemonSet (as a process) together, in a real Prometheus: the job label the monitor sets
    is the one the rules select, and a card below the floor the values set fires
    RankscopeCorridorBreach."""
    found = objects(chart, ALL_ON)
    rule_file = tmp_path / "rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": one(found, "PrometheusRule")["spec"]["groups"]}))
    cards = [{**CARDS[0], "free": "1GiB"}, *CARDS[1:]]  # below its 1.5GB floor
    with (
        running_pod(found, tmp_path / "pod", cards) as pod,
        prometheus(
            tmp_path / "prometheus",
            scrape_targets=[],
            rule_files=[rule_file],
            extra_scrape_configs=[scrape_config(one(found, "ServiceMonitor"), pod)],
        ) as prom,
    ):
        deadline = time.monotonic() + 30
        firing: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            firing = [
                a for a in prom.alerts()
                if a["labels"]["alertname"] == "RankscopeCorridorBreach" and a["state"] == "firing"
            ]  # fmt: skip
            if firing:
                break
            time.sleep(0.5)
        assert [a["labels"]["uuid"] for a in firing] == [UUID], prom.log.read_text()[-2000:]
        assert firing[0]["labels"]["job"] == "rankscope"
        assert prom.query('up{job="rankscope"}')[0]["value"][1] == "1"
        # metricRelabelings of the values dropped rankscope_build_info before storage.
        assert prom.query("rankscope_build_info") == []


def kubelet_probe(probe: dict[str, Any], port: int, context: ssl.SSLContext | None) -> bool:
    """One probe as the kubelet runs it: tcpSocket succeeds on a connection; httpGet, sent
    without credentials, on a status from 200 to 399 (the kubelet skips TLS verification)."""
    if "tcpSocket" in probe:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    get = probe["httpGet"]
    url = f"{get['scheme'].lower()}://127.0.0.1:{port}{get['path']}"
    insecure = ssl._create_unverified_context() if get["scheme"] == "HTTPS" else None
    try:
        with urllib.request.urlopen(url, timeout=5, context=insecure) as resp:
            return 200 <= resp.status < 400
    except (urllib.error.URLError, OSError):
        return False


def wait_tcp(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"rankscope serve exited with {proc.returncode}: {out}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"rankscope serve did not listen on {port} within {timeout}s")


def test_the_daemon_answers_the_default_probes(chart: helm.Chart, tmp_path: Path) -> None:
    """With the default values the probes are HTTP GETs of /healthz and /readyz; the daemon
    started with the default args answers both with a success status."""
    main = container(objects(chart))
    cards = [{"index": 0, "total": "80GiB", "free": "60GiB"}]
    with serving(main["args"], tmp_path, cards) as port:
        for probe in ("livenessProbe", "readinessProbe"):
            assert "httpGet" in main[probe], probe
            deadline = time.monotonic() + 30
            while not kubelet_probe(main[probe], port, None):
                assert time.monotonic() < deadline, f"{probe} kept failing"
                time.sleep(0.1)
