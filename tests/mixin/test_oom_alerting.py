"""RankscopeOutOfMemory in a real Alertmanager with the shipped routing: it pages, and on its
card it holds back the foreign-holder ticket and the corridor-breach page (its description
already names every holder); the same alerts on another card go through."""

from __future__ import annotations

import time
from pathlib import Path

from tests.mixin.test_e2e_alerts import Webhook, alertmanager_config
from tests.mixin.test_mixin_alertmanager import post_alerts
from tests.support import services


def card_alert(name: str, severity: str, uuid: str, **extra: str) -> dict[str, str]:
    return {"alertname": name, "severity": severity, "instance": "h1:19400", "uuid": uuid, **extra}


ALERTS = [
    card_alert(
        "RankscopeOutOfMemory", "critical", "GPU-a", gpu="0", boot="b1", rank="3", pid="500"
    ),
    card_alert("RankscopeForeignHolder", "warning", "GPU-a", gpu="0", pid="4242"),
    card_alert("RankscopeCorridorBreach", "critical", "GPU-a", gpu="0"),
    card_alert("RankscopeForeignHolder", "warning", "GPU-b", gpu="1", pid="4243"),
    card_alert("RankscopeCorridorBreach", "critical", "GPU-c", gpu="2"),
]


def test_the_oom_pages_and_holds_back_its_cards_holder_and_breach(tmp_path: Path) -> None:
    webhook = Webhook()
    try:
        with services.alertmanager(tmp_path, alertmanager_config(webhook.url)) as am:
            post_alerts(am.url, ALERTS)
            deadline = time.monotonic() + 20
            delivered: dict[tuple[str, str], str] = {}
            while time.monotonic() < deadline and len(delivered) < 3:
                time.sleep(0.5)
                delivered = {
                    (a["labels"]["alertname"], a["labels"]["uuid"]): receiver
                    for _, receiver, a in webhook.firing()
                }
            state = {
                (a["labels"]["alertname"], a["labels"]["uuid"]): a["status"]["state"]
                for a in am.alerts()
            }
    finally:
        webhook.close()
    assert delivered == {
        ("RankscopeOutOfMemory", "GPU-a"): "rankscope-pager",
        ("RankscopeForeignHolder", "GPU-b"): "rankscope-tickets",
        ("RankscopeCorridorBreach", "GPU-c"): "rankscope-pager",
    }
    assert {k for k, s in state.items() if s == "suppressed"} == {
        ("RankscopeForeignHolder", "GPU-a"),
        ("RankscopeCorridorBreach", "GPU-a"),
    }
