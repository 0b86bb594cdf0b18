"""`rankscope oom DIR [--boot ID] [--json] [--daemon URL]`: one line per OOM instant the
probe recorded (with --daemon, also those the daemon's sampler saw, which live only in the
daemon): when, which card, which rank and pid failed, the bytes it asked for and the bytes
free, then every holder of the card (pid, comm, rank N of boot B or foreign, bytes)."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse

from rankscope.cli.common import NA, add_flight_dir, open_flight, print_json, when
from rankscope.daemon.paging import MAX_LIMIT
from rankscope.reports.oom import (
    Holding,
    OomEvent,
    SamplerOom,
    oom_events,
    rank_namer,
    sampler_ooms_of_boot,
    sampler_ooms_of_page,
)

GiB = 1 << 30


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    add_flight_dir(parser, name, boot="show")
    parser.add_argument("--json", action="store_true", help="print JSON (bytes) instead of lines")
    parser.add_argument(
        "--daemon",
        metavar="URL",
        type=daemon_url,
        help="also the OOMs the daemon's sampler saw, which no rank recorded: the daemon at "
        "URL (http://127.0.0.1:19400, or HOST:PORT) holds them in memory, never in DIR",
    )


def main(args: argparse.Namespace) -> int:
    every = open_flight(args, all_boots=True)
    chosen = None if every is None else open_flight(args, boot=args.boot)
    if every is None or chosen is None:
        return 2
    # Holders are named against every boot's records: a rank of an older boot that still
    # holds the card is no stranger.
    events = oom_events(chosen.records, namer=rank_namer(every.records))
    sampled: list[SamplerOom] | None = None
    if args.daemon:
        try:
            held, skipped = fetch_sampler_ooms(args.daemon)
        except (OSError, ValueError) as exc:  # unreachable, not a daemon: what DIR holds still
            print(f"rankscope oom: daemon {args.daemon}: {fetch_failure(exc)}", file=sys.stderr)
        else:
            sampled = sampler_ooms_of_boot(held, chosen.boots, chosen.boot)
            if skipped:
                print(
                    f"rankscope oom: {len(skipped)} of the daemon's entries skipped "
                    f"(first: {skipped[0]})",
                    file=sys.stderr,
                )
    if args.json:
        doc = {"boot": chosen.boot, "ooms": [e.as_json() for e in events]}
        if sampled is not None:
            doc["sampler"] = [o.as_json() for o in sampled]
        print_json(doc)
    elif not events and not sampled:
        print(f"no OOM recorded for boot {chosen.boot}" if chosen.boot else "no OOM recorded")
    else:
        lines = [(e.wall, line(e)) for e in events]
        lines += [(o.wall, sampler_line(o)) for o in sampled or []]
        for _, text in sorted(lines, key=lambda wl: wl[0]):
            print(text)
    return 1 if args.daemon and sampled is None else 0


def daemon_url(text: str) -> str:
    """The daemon's base URL: http:// or https://, or a bare HOST:PORT taken as http://."""
    url = text if "://" in text else "http://" + text
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a daemon's address: give http://HOST:PORT or HOST:PORT"
        )
    return url


def fetch_sampler_ooms(base: str, timeout: float = 10.0) -> tuple[list[SamplerOom], list[str]]:
    """The daemon's sampler OOMs (GET /api/v1/oom, page by page), and why each skipped one was."""
    import http.client  # only here, with urllib.request: it loads ssl
    import urllib.request

    # A proxy from the environment (http_proxy, for the internet) is no way to a daemon on
    # this host; any other address takes the proxies and no_proxy as urllib reads them.
    handlers = [urllib.request.ProxyHandler({})] if on_loopback(base) else []
    opener = urllib.request.build_opener(*handlers)
    ooms: list[SamplerOom] = []
    skipped: list[str] = []
    path: str | None = f"/api/v1/oom?limit={MAX_LIMIT}"  # the largest page
    asked: set[str] = set()
    while path is not None:
        if path in asked:  # another server's pages, or a broken one: never loop
            raise ValueError(f"the pages lead back to {path}")
        asked.add(path)
        try:
            with opener.open(base.rstrip("/") + path, timeout=timeout) as answer:
                page, bad, path = sampler_ooms_of_page(json.load(answer))
        except http.client.HTTPException as exc:  # no HTTP there, or an answer cut short
            raise OSError(f"not an HTTP answer: {exc!r}") from exc
        ooms += page
        skipped += bad
    return ooms, skipped


def fetch_failure(exc: Exception) -> str:
    """Why a fetch failed, without urllib's wrapping (``<urlopen error [Errno 111] ...>``)."""
    import urllib.error

    if isinstance(exc, urllib.error.HTTPError):
        return str(exc)  # HTTP Error 404: Not Found
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return getattr(reason, "strerror", None) or str(reason)


def on_loopback(url: str) -> bool:
    """Whether ``url``'s host is this host's loopback (localhost, 127.0.0.0/8, ::1)."""
    import ipaddress

    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it takes the environment's proxies
        return False


def gib(value: int | None) -> str:
    return NA if value is None else f"{value / GiB:.2f} GiB"


def held(h: Holding) -> str:
    role = f"rank {h.rank if h.rank is not None else '?'} of boot {h.boot}"
    return f"{h.pid} {h.comm or '?'} {role if h.role == 'rank' else 'foreign'} {gib(h.bytes)}"


def _card(gpu: int | None, uuid: str | None) -> str:
    return f"gpu {gpu if gpu is not None else NA} ({uuid or 'uuid unknown'})"


def line(e: OomEvent) -> str:
    who = f"rank {e.rank if e.rank is not None else NA} pid {e.host_pid or e.pid}"
    phase = e.phase or "no mark"
    if e.capturing:
        phase += ", in CUDA graph capture"
    head = (
        f"{when(e.wall)}  {_card(e.gpu, e.uuid)}  {who} ({phase}) asked {gib(e.requested)}, "
        f"free {gib(e.free)} of {gib(e.total)}"
    )
    if not e.holders:
        return head + "  holders: unknown (" + "; ".join(e.why or ("not recorded",)) + ")"
    return f"{head}  holders: " + "; ".join(held(h) for h in e.holders)


def sampler_line(o: SamplerOom) -> str:
    head = f"{when(o.wall)}  {_card(o.gpu, o.uuid)}  seen by the daemon's sampler (no rank's "
    head += f"record): free {gib(o.free)} at worst"
    if o.onset_wall is not None:
        head += f", {gib(o.onset_free)} at the onset {when(o.onset_wall)}"
    if o.holders is None:
        return head + "  holders: unknown (" + "; ".join(o.why or ("not read",)) + ")"
    return head + "  holders: " + ("; ".join(held(h) for h in o.holders) or "none")
