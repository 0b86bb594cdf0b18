"""The shipped routing in a real Alertmanager: alerts posted to its API reach the pager or the
ticket queue by severity, and the inhibitions hold back exactly the alerts they name. Among
them RankscopeOutOfMemory: it pages, and on its card it holds back the foreign-holder ticket
and the corridor-breach page (its description already names every holder); the same alerts
on another card go through."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
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


def deliver(
    tmp_path: Path, alerts: list[dict[str, str]], key: Callable[[dict[str, str]], Any], pages: int
) -> tuple[dict[Any, str], dict[Any, dict[str, Any]]]:
    """Post ``alerts`` to a real Alertmanager with the shipped routing; by ``key`` of their
    labels, the receiver of each page (waiting for ``pages`` of them) and each alert's status."""
    webhook = Webhook()
    try:
        with services.alertmanager(tmp_path, alertmanager_config(webhook.url)) as am:
            post_alerts(am.url, alerts)
            deadline = time.monotonic() + 20
            delivered: dict[Any, str] = {}
            while time.monotonic() < deadline and len(delivered) < pages:
                time.sleep(0.5)
                delivered = {key(a["labels"]): receiver for _, receiver, a in webhook.firing()}
            return delivered, {key(a["labels"]): a["status"] for a in am.alerts()}
    finally:
        webhook.close()


def card_alert(name: str, severity: str, uuid: str, **extra: str) -> dict[str, str]:
    return {"alertname": name, "severity": severity, "instance": "h1:19400", "uuid": uuid, **extra}


def key(labels: dict[str, Any]) -> tuple[str, str, str]:
    by = labels.get("boot") or labels.get("uuid", "")
    return labels["alertname"], by, labels.get("instance", "")


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
    card_alert("RankscopeCorridorBreach", "critical", "GPU-a", gpu="0"),
    card_alert("RankscopeForeignHolder", "warning", "GPU-a", gpu="0", pid="7"),
    card_alert("RankscopeCorridorThin", "warning", "GPU-a", gpu="0"),
    card_alert("RankscopeForeignHolder", "warning", "GPU-b", gpu="1", pid="8"),
    # Same uuid on another daemon: inhibition is per card of one daemon.
    card_alert("RankscopeCorridorThin", "warning", "GPU-a", gpu="0", instance="h2:19400"),
]
INHIBITED = {
    ("RankscopeCensusStalled", "b1"),
    ("RankscopeNcclCountMismatch", "b1"),
    ("RankscopeForeignHolder", "GPU-a"),
}


def test_routing_and_inhibitions(tmp_path: Path) -> None:
    delivered, state = deliver(tmp_path, ALERTS, key, pages=7)
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


OOM_ALERTS = [
    card_alert(
        "RankscopeOutOfMemory", "critical", "GPU-a", gpu="0", boot="b1", rank="3", pid="500"
    ),
    card_alert("RankscopeForeignHolder", "warning", "GPU-a", gpu="0", pid="4242"),
    card_alert("RankscopeCorridorBreach", "critical", "GPU-a", gpu="0"),
    card_alert("RankscopeForeignHolder", "warning", "GPU-b", gpu="1", pid="4243"),
    card_alert("RankscopeCorridorBreach", "critical", "GPU-c", gpu="2"),
]


def by_card(labels: dict[str, Any]) -> tuple[str, str]:
    return labels["alertname"], labels["uuid"]


def test_the_oom_pages_and_holds_back_its_cards_holder_and_breach(tmp_path: Path) -> None:
    delivered, state = deliver(tmp_path, OOM_ALERTS, by_card, pages=3)
    assert delivered == {
        ("RankscopeOutOfMemory", "GPU-a"): "rankscope-pager",
        ("RankscopeForeignHolder", "GPU-b"): "rankscope-tickets",
        ("RankscopeCorridorBreach", "GPU-c"): "rankscope-pager",
    }
    assert {k for k, s in state.items() if s["state"] == "suppressed"} == {
        ("RankscopeForeignHolder", "GPU-a"),
        ("RankscopeCorridorBreach", "GPU-a"),
    }
