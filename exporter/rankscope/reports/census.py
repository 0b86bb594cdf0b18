"""The census report: flight records -> what ``rankscope census --json`` prints (and the
daemon serves at /api/v1/census). A pure function of the records.

Per group instance, the counts of its member ranks are compared at the latest round at
which every member left a snapshot (ranks snapshot at the same rounds, since ``tick()`` is
replicated; a rank killed with SIGKILL still counts with its last snapshot). Divergences at
earlier rounds are listed in ``history`` with the rounds they spanned, even when the counts
agree again later. Local dumps (taken at abort, not at a common round) are compared too, in
their own section.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rankscope.record import AnyLine, Census, CensusDump, Divergence, Line
from rankscope.record.compare import Entry, compare_group, members_of, split_by_group
from rankscope.record.naming import parse_p2p, report_op_name
from rankscope.reports.rounds import GroupRound, SnapshotsByRank, group_rounds

if TYPE_CHECKING:
    from rankscope.record.reader import Flight

CENSUS_KINDS = (Census, CensusDump, Divergence)

Record = AnyLine


class _Rank:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.process: tuple[Any, ...] | None = None
        self.last_wall = float("-inf")
        self.snapshots: dict[int, Census] = {}  # by round
        self.snapshot_wall: dict[int, float] = {}
        self.every: int | None = None
        self.dump: dict[str, Any] | None = None
        self.dump_counts: dict[str, dict[str, int]] = {}


def _select_processes(
    records: Iterable[Record], skipped: collections.Counter[str]
) -> dict[int, list[Record]]:
    """Census records per rank, from the newest process of each rank (a rank restarted
    within one boot starts its counts again)."""
    by_process: dict[tuple[Any, ...], list[Record]] = collections.defaultdict(list)
    for rec in records:
        if not isinstance(rec.body, CENSUS_KINDS):
            continue
        h = rec.header
        if h.rank is None:
            skipped["no_rank"] += 1
            continue
        by_process[(h.rank, h.host, h.pid, h.start_ticks)].append(rec)
    newest: dict[int, tuple[float, tuple[Any, ...]]] = {}
    for key, recs in by_process.items():
        last = max(r.header.wall for r in recs)
        rank = key[0]
        if rank not in newest or last > newest[rank][0]:
            if rank in newest:
                skipped["superseded_process"] += len(by_process[newest[rank][1]])
            newest[rank] = (last, key)
        else:
            skipped["superseded_process"] += len(recs)
    return {rank: by_process[key] for rank, (_, key) in newest.items()}


def _load(
    per_rank_records: dict[int, list[Record]], skipped: collections.Counter[str]
) -> tuple[dict[int, _Rank], list[Line[Divergence]]]:
    ranks: dict[int, _Rank] = {}
    divergences: list[Line[Divergence]] = []
    for rank, recs in per_rank_records.items():
        state = ranks[rank] = _Rank(rank)
        for rec in recs:
            h, body = rec.header, rec.body
            state.process = (h.host, h.pid, h.start_ticks)
            state.last_wall = max(state.last_wall, h.wall)
            if isinstance(body, Divergence):
                divergences.append(Line(h, body))
                continue
            if not isinstance(body, (Census, CensusDump)):
                continue
            if body.counts is None or body.round is None:
                skipped["bad_census_line"] += 1
                continue
            if isinstance(body, Census):
                state.snapshots[body.round] = body
                state.snapshot_wall[body.round] = h.wall
                if body.every is not None:
                    state.every = body.every
            elif state.dump is None or h.wall >= state.dump["wall"]:
                state.dump = {"reason": str(body.reason), "round": body.round, "wall": h.wall}
                state.dump_counts = split_by_group(body.counts)
    return ranks, divergences


def _spans(
    rounds: Iterable[int], entries_at: dict[int, dict[str, Entry]], latest: int
) -> list[Entry]:
    """Runs of consecutive common rounds where an op diverged with the same lagging ranks."""
    spans: list[Entry] = []
    open_spans: dict[str, Entry] = {}
    for round_ in rounds:
        current = entries_at[round_]
        for op in list(open_spans):
            entry = current.get(op)
            span = open_spans[op]
            if entry is None or not entry["divergent"] or entry["lagging"] != span["lagging"]:
                spans.append(open_spans.pop(op))
            else:
                span["rounds"][1] = round_
        for op, entry in current.items():
            if entry["divergent"] and op not in open_spans:
                open_spans[op] = dict(entry, round=round_, rounds=[round_, round_])
    spans.extend(open_spans.values())
    for span in spans:
        span["resolved"] = span["rounds"][1] != latest
    return spans


def build_report(
    records: Iterable[Record], *, boot: str | None = None, skipped: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The census of one boot's records (pass the records of one boot: ``read_flight``
    scopes them). ``skipped`` carries the reader's own skip counts into the report."""
    skips: collections.Counter[str] = collections.Counter(skipped or {})
    ranks, divergences = _load(_select_processes(records, skips), skips)
    groups, entries, history = _snapshot_sections(ranks)
    everies = sorted({s.every for s in ranks.values() if s.every is not None})
    return {
        "boot": boot,
        "ranks": [_rank_summary(ranks[r]) for r in sorted(ranks)],
        "every": everies[0] if len(everies) == 1 else everies or None,
        "groups": groups,
        "entries": entries,
        "divergent": any(e["divergent"] for e in entries),
        "first_divergent_round": min((e["rounds"][0] for e in history), default=None),
        "history": history,
        "dumps": _dump_section(ranks),
        "in_process": _in_process_section(divergences),
        "in_process_lines": len(divergences),
        "skipped": dict(sorted(skips.items())),
    }


def _snapshot_sections(
    ranks: dict[int, _Rank],
) -> tuple[list[dict[str, Any]], list[Entry], list[Entry]]:
    """(groups, entries at each group's latest common round, history of divergences) from
    the snapshots: every group instance compared over its members' common rounds
    (rankscope.reports.rounds, the rule the daemon's census collector applies too)."""
    snapshots = SnapshotsByRank({r: s.snapshots for r, s in ranks.items()})
    groups: list[dict[str, Any]] = []
    entries: list[Entry] = []
    history: list[Entry] = []
    for found in group_rounds(snapshots):
        compared = found.rounds if len(found.members) > 1 else ()
        groups.append(
            {
                "group": found.group,
                "members": list(found.members),
                "round": found.round,
                "rounds_compared": len(compared),
            }
        )
        if not compared:
            continue
        entries.extend(dict(e, round=found.round) for e in found.entries)
        history.extend(_spans(compared, _entries_by_round(found, snapshots), compared[-1]))
    history.sort(key=lambda e: (e["rounds"][0], e["group"], e["op"]))
    return groups, entries, history


def _entries_by_round(found: GroupRound, snapshots: SnapshotsByRank) -> dict[int, dict[str, Entry]]:
    """Per common round of ``found``, the comparison of its members, by op (the latest is
    the one :func:`group_rounds` made)."""
    entries_at = {found.rounds[-1]: {e["op"]: e for e in found.entries}}
    for r in found.rounds[:-1]:
        at = [snapshots.groups_at(m, r).get(found.group, {}) for m in found.members]
        if all(ops == at[0] for ops in at[1:]) and all(parse_p2p(op) is None for op in at[0]):
            entries_at[r] = {}  # every member agrees on every op: nothing to list
            continue
        per_rank = dict(zip(found.members, at, strict=True))
        entries_at[r] = {e["op"]: e for e in compare_group(found.group, per_rank)}
    return entries_at


def _dump_section(ranks: dict[int, _Rank]) -> dict[str, Any]:
    """The local dumps (taken at abort or exit, not at a common round), compared per group."""
    dumped = {r: s for r, s in ranks.items() if s.dump is not None}
    dump_entries: list[Entry] = []
    for group in sorted({g for s in dumped.values() for g in s.dump_counts}):
        reporters = [r for r, s in dumped.items() if group in s.dump_counts]
        members = members_of(group, dumped, reporters)
        if len(members) >= 2:
            dump_entries.extend(
                compare_group(group, {m: dumped[m].dump_counts.get(group, {}) for m in members})
            )
    return {
        "ranks": [{"rank": r, **(dumped[r].dump or {})} for r in sorted(dumped)],
        "entries": dump_entries,
    }


def _in_process_section(divergences: list[Line[Divergence]]) -> list[dict[str, Any]]:
    """The in-process comparison's latest line per (group, op)."""
    latest: dict[tuple[str, str], Line[Divergence]] = {}
    for line in sorted(divergences, key=lambda d: (d.body.round or 0, d.header.wall)):
        latest[(line.body.group, line.body.op)] = line
    return [
        {
            "round": line.body.round,
            "group": line.body.group,
            "op": line.body.op,
            "counts": {str(r): n for r, n in line.body.counts.items()},
            "lagging": list(line.body.lagging),
            "rank": line.header.rank,
        }
        for line in latest.values()
    ]


def census_document(flight: Flight) -> dict[str, Any]:
    """What `rankscope census --json` prints and /api/v1/census returns, for one read."""
    return build_report(flight.records, boot=flight.boot, skipped=flight.skipped)


def _rank_summary(state: _Rank) -> dict[str, Any]:
    last_round = max(state.snapshots) if state.snapshots else None
    host, pid, start_ticks = state.process or (None, None, None)
    return {
        "rank": state.rank,
        "host": host,
        "pid": pid,
        "start_ticks": start_ticks,
        "snapshots": len(state.snapshots),
        "last_round": last_round,
        "last_snapshot_wall": state.snapshot_wall.get(last_round) if last_round else None,
        "counts": [
            [g, op, n]
            for g, ops in sorted(split_by_group(state.snapshots[last_round].counts or {}).items())
            for op, n in sorted((report_op_name(state.rank, op), n) for op, n in ops.items())
        ]
        if last_round is not None
        else [],
        "dump": state.dump,
    }


# --- text ---------------------------------------------------------------------------------


def _counts_text(counts: Mapping[str, int]) -> str:
    values = set(counts.values())
    if len(values) == 1 and len(counts) > 2:
        return f"all {len(counts)}: {next(iter(values))}"
    return " ".join(f"{r}:{n}" for r, n in counts.items())


def _status(entry: Entry) -> str:
    if not entry["divergent"]:
        return "ok"
    return "DIVERGENT, lagging: " + ",".join(str(r) for r in entry["lagging"])


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def render_text(report: Mapping[str, Any]) -> str:
    ranks = report["ranks"]
    if not ranks:
        boot = report["boot"]
        return "no census records" + (f" in boot {boot}" if boot else "") + "\n"
    lines: list[str] = []
    every = report["every"]
    lines.append(
        f"census of boot {report['boot']}: {len(ranks)} rank(s) with census records"
        + (f", a snapshot every {every} ticks" if every else "")
    )
    if not report["entries"]:
        lines.append("no group instance has two ranks with a snapshot at a common round")
    else:
        rows = [["GROUP", "OP", "ROUND", "COUNTS (rank:n)", "STATUS"]]
        rows += [
            [e["group"], e["op"], str(e["round"]), _counts_text(e["counts"]), _status(e)]
            for e in report["entries"]
        ]
        lines.append("")
        lines.extend(_table(rows))
    lines.append("")
    first = report["first_divergent_round"]
    if first is None:
        lines.append("no divergence at any compared round")
    else:
        lines.append(f"first divergence at round {first}")
        lines.append("divergences by the rounds they spanned:")
        for e in report["history"]:
            span = e["rounds"]
            rounds = f"round {span[0]}" if span[0] == span[1] else f"rounds {span[0]}-{span[1]}"
            state = "resolved since" if e["resolved"] else "still at the latest common round"
            lines.append(
                f"  {e['group']} {e['op']}: {rounds}, first counts {_counts_text(e['counts'])}, "
                f"lagging {','.join(map(str, e['lagging']))} ({state})"
            )
    if report["in_process"]:
        lines.append("")
        lines.append(
            f"in-process comparison ({report['in_process_lines']} divergence line(s)), "
            "latest per op:"
        )
        for d in report["in_process"]:
            counts = d["counts"] if isinstance(d["counts"], dict) else {}
            lagging = d["lagging"] or []
            state = f"lagging {','.join(map(str, lagging))}" if lagging else "agree again"
            lines.append(
                f"  round {d['round']}: {d['group']} {d['op']} {_counts_text(counts)}, {state}"
            )
    dumps = report["dumps"]
    if dumps["ranks"]:
        lines.append("")
        lines.append("local dumps (taken at abort or exit, not at a common round):")
        for d in dumps["ranks"]:
            lines.append(f"  rank {d['rank']}: {d['reason']} at round {d['round']}")
        if dumps["entries"]:
            rows = [["GROUP", "OP", "COUNTS AT DUMP", "STATUS"]]
            rows += [
                [e["group"], e["op"], _counts_text(e["counts"]), _status(e)]
                for e in dumps["entries"]
            ]
            lines.extend("  " + row for row in _table(rows))
    lines.append("")
    lines.append("ranks:")
    for r in ranks:
        last = r["last_round"]
        lines.append(
            f"  rank {r['rank']}: pid {r['pid']} on {r['host']}, {r['snapshots']} snapshot(s)"
            + (f", last at round {last}" if last is not None else "")
        )
    if report["skipped"]:
        lines.append("")
        lines.append("skipped: " + ", ".join(f"{k} {v}" for k, v in report["skipped"].items()))
    return "\n".join(lines) + "\n"
