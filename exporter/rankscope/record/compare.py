"""Comparing per-rank census counts, one rule for the in-process comparison and the reader.
An op missing on a member rank counts as zero; a sender's ``send>b`` and the receiver's
``recv<a`` pair into one channel entry ``p2p a>b``."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from rankscope.record.census import split_by_group
from rankscope.record.naming import SEND, Key, channel_name, parse_instance, parse_p2p

try:  # hashlib's own blake2b, without hashlib, which loads OpenSSL's libcrypto (~3.5 MiB
    # resident) into the daemon (docs/architecture.md, "What the daemon imports")
    from _blake2 import blake2b
except ImportError:  # an interpreter built without it
    from hashlib import blake2b

Entry = dict[str, Any]  # {group, op, counts: {"<rank>": n}, divergent, lagging: [rank]}


def make_entry(group: str, op: str, counts: Mapping[int, int]) -> Entry:
    top = max(counts.values()) if counts else 0
    lagging = sorted(r for r, n in counts.items() if n < top)
    return {
        "group": group,
        "op": op,
        "counts": {str(r): counts[r] for r in sorted(counts)},
        "divergent": bool(lagging),
        "lagging": lagging,
    }


def compare_group(group: str, per_rank: Mapping[int, Mapping[str, int]]) -> list[Entry]:
    """Entries for every op of one group instance; ``per_rank``: member -> {op: count}."""
    members = sorted(per_rank)
    collective_ops: set[str] = set()
    channels: set[tuple[int, int]] = set()
    for rank in members:
        for op in per_rank[rank]:
            p2p = parse_p2p(op)
            if p2p is None:
                collective_ops.add(op)
            else:
                kind, peer = p2p
                channels.add((rank, peer) if kind == SEND else (peer, rank))
    entries = [
        make_entry(group, op, {r: per_rank[r].get(op, 0) for r in members})
        for op in sorted(collective_ops)
    ]
    for src, dst in sorted(channels):
        if src == dst or src not in per_rank or dst not in per_rank:
            continue  # the other end is not here to compare with
        counts = {
            src: per_rank[src].get(f"send>{dst}", 0),
            dst: per_rank[dst].get(f"recv<{src}", 0),
        }
        entries.append(make_entry(group, channel_name(src, dst), counts))
    return entries


def compare_ranks(
    per_rank: Mapping[int, Mapping[Key, int]], settled: Collection[int] | None = None
) -> list[Entry]:
    """Entries for every group instance among ``per_rank`` (rank -> counts at one round);
    given ``settled``, only those whose members all are."""
    return compare_split({rank: split_by_group(c) for rank, c in per_rank.items()}, settled)


def instances(split: Mapping[int, Mapping[str, Any]]) -> Iterator[tuple[str, list[int]]]:
    """Every group instance among ``split`` (rank -> {group: ...}), by name, with the ranks
    to compare for it: its named members present, else its reporters."""
    for group in sorted({g for by_group in split.values() for g in by_group}):
        parsed = parse_instance(group)
        if parsed is None:
            yield group, sorted(r for r, by_group in split.items() if group in by_group)
        else:
            yield group, [r for r in parsed[1] if r in split]


def compare_split(
    split: Mapping[int, Mapping[str, Mapping[str, int]]], settled: Collection[int] | None = None
) -> list[Entry]:
    """Entries for every group instance among ``split`` (rank -> {group: {op: n}}) with two
    members or more; given ``settled``, only those whose members all are."""
    entries: list[Entry] = []
    for group, members in instances(split):
        if len(members) < 2 or (settled is not None and any(m not in settled for m in members)):
            continue
        entries.extend(compare_group(group, {r: split[r].get(group, {}) for r in members}))
    return entries


# A digest is published as a Prometheus sample, a float64: integers up to 2**53 are exact.
DIGEST_BITS = 53


def digest(counts: Mapping[str, int]) -> int:
    """A hash of one group instance's {op: count} below 2**DIGEST_BITS, equal across hosts
    and processes for equal counts. P2p ops (named differently on each end) and zero counts
    are left out, as in :func:`compare_group`."""
    text = "\n".join(
        f"{op}\t{n}" for op, n in sorted(counts.items()) if n and parse_p2p(op) is None
    )
    raw = blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(raw, "big") >> (64 - DIGEST_BITS)
