"""`rankscope phases DIR [--boot ID] [--json]`: per process, the posts between its phases;
per card, what its memory was made of at each mark. --json prints /api/v1/phases's document."""

from __future__ import annotations

import argparse
from typing import Any

from rankscope.cli import common
from rankscope.reports.ledger import VIEWS, phases_document

POST_HEADER = ("post (MiB)", "runner", "s")
VIEW_HEADER = ("reserved", "allocated", "driver", "process", "non-torch")  # VIEWS, in order
CARD_HEADER = ("at mark (MiB)", "pid", "total", "rank-resident", "foreign", "free")
CARD_SIGNED = ("unattributed", "drift")


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    common.add_flight_dir(parser, name, boot="show")
    parser.add_argument("--json", action="store_true", help="print JSON (bytes) instead of a table")


def main(args: argparse.Namespace) -> int:
    flight = common.open_flight(args, boot=args.boot)
    if flight is None:
        return 2
    document = phases_document(flight)
    if args.json:
        common.print_json(document)
        return 0
    if document["boot"] is None:
        print(common.no_boots_hint(args.flight_dir), end="")
        return 0
    n = len(document["processes"])
    print(f"boot {document['boot']}: {n} process{'es' if n != 1 else ''}")
    for process in document["processes"]:
        _print_process(process)
    for card in document["cards"]:
        _print_card(card)
    if note := common.skipped_note(document["skipped"]):
        print("\n" + note)
    return 0


def _print_process(process: dict[str, Any]) -> None:
    who = [f"pid {process['pid']}", f"start {process['start_ticks']}"]
    for name in ("rank", "tp_rank", "pp_rank"):
        if process.get(name) is not None:
            who.append(f"{name.replace('_rank', '')} {process[name]}")
    cards = {(m["gpu"], m["uuid"]) for m in process["marks"] if m["uuid"]}
    for gpu, uuid in sorted(cards, key=lambda c: (c[0] is None, c[0] or 0)):
        who.append(f"gpu {gpu if gpu is not None else '?'} {uuid}")
    print("\nprocess " + "  ".join(who))
    if not process["posts"]:
        print("  no posts (fewer than two marks per runner)")
    else:
        rows = [
            [p["post"], p["runner"] or "-", f"{p['seconds']:.2f}"]
            + [common.mib(p["views"][view], signed=True) for view in VIEWS]
            for p in process["posts"]
        ]
        print(*common.table([POST_HEADER + VIEW_HEADER, *rows], indent="  "), sep="\n")
    unmeasured: dict[str, list[str]] = {}
    for m in process["marks"]:
        for why in dict.fromkeys(m["why"].values()):
            unmeasured.setdefault(why, []).append(m["phase"])
    for why, phases in unmeasured.items():
        print(f"  n/a at {', '.join(phases)}: {why}")


def _print_card(card: dict[str, Any]) -> None:
    gpu = card["gpu"] if card["gpu"] is not None else "?"
    print(f"\ncard gpu {gpu} {card['uuid']}: total = rank-resident + foreign + free + unattributed")
    rows = [
        [i["phase"], str(i["pid"])]
        + [common.mib(i[field]) for field in ("total", "rank_resident", "foreign", "free")]
        + [common.mib(i[field], signed=True) for field in CARD_SIGNED]
        for i in card["identities"]
    ]
    print(*common.table([CARD_HEADER + CARD_SIGNED, *rows], indent="  "), sep="\n")
    if foreign := {pid for i in card["identities"] for pid in i["foreign_pids"]}:
        print(f"  foreign pids seen: {', '.join(sorted(foreign, key=int))}")
