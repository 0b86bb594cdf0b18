"""The shipped routing in a real Alertmanager: alerts posted to its API reach the pager or the
ticket queue by severity, and the inhibitions hold back exactly the alerts they name."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.mixin.test_e2e_alerts import Webhook, alertmanager_config
from tests.support import services


def post_alerts(url: str, alerts: list[dict[str, str]]) -> None:
    body = json.dumps([{"labels": labels, "annotations": {}} for labels in alerts]).encode()
    request = urllib.request.Request(
        f"{url}/api/v2/alerts", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def key(labels: dict[str, Any]) -> tuple[str, str]:
    return labels["alertname"], labels.get("boot") or labels.get("uuid", "")


ALERTS = [
    {"alertname": "RankscopeCensusSkew", "severity": "critical", "boot": "b1", "rank": "2"},
    # RAS sees the census's skew of b1 too: one page. A RAS mismatch on a communicator no
    # flight record maps (no boot) pages on its own, as does a dead peer.
    {
        "alertname": "RankscopeNcclCountMismatch",
        "severity": "critical",
        "boot": "b1",
        "op": "AllReduce",
    },
    {
        "alertname": "RankscopeNcclCountMismatch",
        "severity": "critical",
        "comm": "0x9181",
        "op": "AllReduce",
    },
    {"alertname": "RankscopeNcclPeerDead", "severity": "critical", "endpoint": "localhost:28028"},
    {"alertname": "RankscopeCensusStalled", "severity": "warning", "boot": "b1", "rank": "0"},
    {"alertname": "RankscopeCensusStalled", "severity": "warning", "boot": "b2", "rank": "0"},
    {
        "alertname": "RankscopeCorridorBreach",
        "severity": "critical",
        "instance": "h1:19400",
        "gpu": "0",
        "uuid": "GPU-a",
    },
    {
        "alertname": "RankscopeForeignHolder",
        "severity": "warning",
        "instance": "h1:19400",
        "gpu": "0",
        "uuid": "GPU-a",
        "pid": "7",
    },
    {
        "alertname": "RankscopeCorridorThin",
        "severity": "warning",
        "instance": "h1:19400",
        "gpu": "0",
        "uuid": "GPU-a",
    },
    {
        "alertname": "RankscopeForeignHolder",
        "severity": "warning",
        "instance": "h1:19400",
        "gpu": "1",
        "uuid": "GPU-b",
        "pid": "8",
    },
    # Same uuid on another daemon: inhibition is per card of one daemon.
    {
        "alertname": "RankscopeCorridorThin",
        "severity": "warning",
        "instance": "h2:19400",
        "gpu": "0",
        "uuid": "GPU-a",
    },
]
INHIBITED = {
    ("RankscopeCensusStalled", "b1"),
    ("RankscopeNcclCountMismatch", "b1"),
    ("RankscopeForeignHolder", "GPU-a"),
}


def test_routing_and_inhibitions(tmp_path: Path) -> None:
    webhook = Webhook()
    try:
        with services.alertmanager(tmp_path, alertmanager_config(webhook.url)) as am:
            post_alerts(am.url, ALERTS)
            deadline = time.monotonic() + 20
            delivered: dict[tuple[str, str, str], str] = {}
            while time.monotonic() < deadline and len(delivered) < 7:
                time.sleep(0.5)
                delivered = {
                    (*key(alert["labels"]), alert["labels"].get("instance", "")): receiver
                    for _, receiver, alert in webhook.firing()
                }
            state = {
                (*key(a["labels"]), a["labels"].get("instance", "")): a["status"]
                for a in am.alerts()
            }
    finally:
        webhook.close()

    suppressed = {k[:2] for k, status in state.items() if status["state"] == "suppressed"}
    # The thin card of h1 is inhibited by its breach; the same uuid on h2 is not.
    assert suppressed == INHIBITED | {("RankscopeCorridorThin", "GPU-a")}
    assert ("RankscopeCorridorThin", "GPU-a", "h2:19400") not in {
        k for k, status in state.items() if status["state"] == "suppressed"
    }
    for k, status in state.items():
        if status["state"] == "suppressed":
            assert status["inhibitedBy"], k
    assert delivered == {
        ("RankscopeCensusSkew", "b1", ""): "rankscope-pager",
        ("RankscopeNcclCountMismatch", "", ""): "rankscope-pager",
        ("RankscopeNcclPeerDead", "", ""): "rankscope-pager",
        ("RankscopeCensusStalled", "b2", ""): "rankscope-tickets",
        ("RankscopeCorridorBreach", "GPU-a", "h1:19400"): "rankscope-pager",
        ("RankscopeForeignHolder", "GPU-b", "h1:19400"): "rankscope-tickets",
        ("RankscopeCorridorThin", "GPU-a", "h2:19400"): "rankscope-tickets",
    }
