"""NCCL RAS status reports -> typed reports, no I/O: JSON (2.28.7+) gives every rank with
its counts; text (2.24+) gives grouped rows, dead processes and NCCL's own mismatches
(docs/nccl-ras-notes.md). A report that does not parse raises :class:`ReportError`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

# The reasons a poll fails, a closed set (the label values of the self metrics).
ERROR_REASONS = ("refused", "timeout", "truncated", "malformed", "too_large", "unknown_version")
# The only protocol number any NCCL (2.24 .. 2.30) has spoken.
KNOWN_PROTOCOL = 2


class ReportError(Exception):
    """A poll or report that cannot be used; ``reason`` is one of ERROR_REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in ERROR_REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


OptInt = Annotated[int | None, BeforeValidator(_int_or_none)]  # anything else: unknown


class _Parsed(BaseModel):
    model_config = ConfigDict(frozen=True)


class RasRank(_Parsed):
    """``status`` is the JSON status object flattened to a comparable tuple."""

    rank: StrictInt
    host: StrictStr
    pid: StrictInt  # -1 when NCCL does not know it
    cuda_dev: OptInt = None
    counts: dict[str, StrictInt] = Field(validation_alias="collective_counts")
    status: tuple[tuple[str, Any], ...]

    @field_validator("status", mode="before")
    @classmethod
    def _flatten(cls, status: object) -> object:
        if not isinstance(status, dict):
            raise ValueError("is not an object")
        return tuple(sorted(status.items()))


class MissingRank(_Parsed):
    rank: StrictInt
    host: StrictStr
    pid: StrictInt  # -1 when NCCL does not know it
    unresponsive: bool = False
    considered_dead: bool = False

    @model_validator(mode="before")
    @classmethod
    def _from_status(cls, raw: object) -> object:
        if not isinstance(raw, dict):
            return raw
        status = raw["status"] if isinstance(raw.get("status"), dict) else {}
        return {**raw, **{f: status.get(f) is True for f in ("unresponsive", "considered_dead")}}


class Communicator(_Parsed):
    """``key``: hash + secondary hash (the hash alone is not unique; text has none: "")."""

    hash: StrictStr
    secondary_hash: StrictStr
    size: StrictInt | None
    ranks_count: StrictInt | None
    missing_ranks_count: StrictInt | None
    ranks: tuple[RasRank, ...] = ()
    missing: tuple[MissingRank, ...] = Field(default=(), validation_alias="missing_ranks")
    # Mismatches NCCL itself reported (text Warnings section): op names, or "status".
    reported_mismatches: tuple[str, ...] = ()

    @field_validator("size", "ranks_count", "missing_ranks_count", mode="before")
    @classmethod
    def _given(cls, value: object) -> object:
        if value is None:  # None only from a text report, built unvalidated
            raise ValueError("is not an integer")
        return value

    @property
    def key(self) -> tuple[str, str]:
        return (self.hash, self.secondary_hash)


_COMMUNICATORS = TypeAdapter(tuple[Communicator, ...])


@dataclass(frozen=True)
class RasReport:
    format: str  # "json" or "text"
    nccl_version: str
    cuda_runtime_version: int | None
    cuda_driver_version: int | None
    communicators: tuple[Communicator, ...]
    dead_count: int = 0  # text only (JSON marks each missing rank)


def parse_report(data: bytes) -> RasReport:
    """A report as the server sent it: JSON when it starts with '{', text otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportError("malformed", f"not UTF-8 at byte {exc.start}") from None
    return parse_json_report(text) if text.lstrip().startswith("{") else parse_text_report(text)


def parse_json_report(text: str) -> RasReport:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        # An error at the very end, or a string never closed, is a report cut short.
        cut = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
        reason = "truncated" if cut else "malformed"
        raise ReportError(reason, f"JSON: {exc.msg} at char {exc.pos}") from None
    if not isinstance(doc, dict):
        raise ReportError("malformed", "JSON report is not an object")
    version = doc.get("nccl_version")
    if not isinstance(version, str) or not _version_ok(version):
        raise ReportError("unknown_version", f"nccl_version {version!r}")
    try:
        comms = _COMMUNICATORS.validate_python(doc.get("communicators"))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        raise ReportError("malformed", f"communicators{where}: {error['msg']}") from None
    return RasReport(
        format="json",
        nccl_version=version,
        cuda_runtime_version=_int_or_none(doc.get("cuda_runtime_version")),
        cuda_driver_version=_int_or_none(doc.get("cuda_driver_version")),
        communicators=comms,
    )


def _version_ok(version: str) -> bool:
    return re.fullmatch(r"\d+\.\d+\.\d+", version.split("+")[0]) is not None


_VERSION_LINE = re.compile(r"NCCL version (\S+)")
_CUDA_LINE = re.compile(r"CUDA runtime version (\d+), driver version (\d+)")
# "%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s": group, comms, nodes/comm, ranks/node (may be
# a range "7-8"), ranks/comm, ranks in group, status, errors.
_GROUP_ROW = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+([\d-]+)\s+(\d+)\s+(\d+)\s+([A-Z]+)\s+([A-Z,]+)\s*$"
)
_DEAD_COUNT = re.compile(r"^\s*(\d+) job process(?:es are| is) considered dead")
_COMM_ENTRY = re.compile(r"^#(\d+)-(\d+) \(([0-9a-fA-F]+)\) ([A-Z,]+)\s*$")
# 2.24 and 2.25 name no op: "different collective operation counts".
_MISMATCH_OP = re.compile(r"Communicator ranks have different (\w+) operation counts")
_MISMATCH_STATUS = "Communicator ranks have different status"


def parse_text_report(text: str) -> RasReport:
    lines = text.splitlines()
    if not lines:
        raise ReportError("truncated", "empty report")
    head = _VERSION_LINE.match(lines[0])
    if head is None:
        raise ReportError("malformed", f"first line {lines[0][:60]!r} is not 'NCCL version'")
    version = head.group(1)
    if not _version_ok(version):
        raise ReportError("unknown_version", f"NCCL version {version!r}")
    # Every text report ends with its Warnings section, possibly empty.
    if "Warnings" not in (line.strip() for line in lines):
        raise ReportError("truncated", "no Warnings section")
    cuda = _CUDA_LINE.match(lines[1]) if len(lines) > 1 else None
    rows: list[tuple[int, int, int]] = []  # group, comms, ranks per comm
    dead_count = 0
    hashes: dict[str, str] = {}  # "#group-index" -> NCCL's hash
    mismatches: dict[str, list[str]] = {}  # "#group-index" -> ops, or "status"
    block, entry = "", None  # the unindented line an indented one belongs to (DEAD, a comm)
    for section, line in _sections(lines):
        if section == "Communicators" and (row := _GROUP_ROW.match(line)):
            rows.append((int(row[1]), int(row[2]), int(row[5])))
        elif section not in ("Errors", "Warnings"):
            continue
        elif line and not line.startswith(" "):
            block, entry = line.strip(), None
            if found := _COMM_ENTRY.match(block):
                entry = f"#{found[1]}-{found[2]}"
                hashes[entry] = "0x" + found[3].lower()
        elif block == "DEAD" and (count := _DEAD_COUNT.match(line)):
            dead_count = int(count[1])
        elif entry is not None and section == "Warnings":
            op = _MISMATCH_OP.search(line)
            what = op[1] if op else "status" if _MISMATCH_STATUS in line else None
            if what is not None:
                mismatches.setdefault(entry, []).append(what)
    # Each grouped row's comms, by the hash NCCL printed for their "#group-index", or by it.
    ids = [(f"#{group}-{i}", size) for group, n_comms, size in rows for i in range(n_comms)]
    return RasReport(
        format="text",
        nccl_version=version,
        cuda_runtime_version=int(cuda[1]) if cuda else None,
        cuda_driver_version=int(cuda[2]) if cuda else None,
        communicators=tuple(
            Communicator.model_construct(
                hash=hashes.get(id_, id_),
                secondary_hash="",
                size=size,
                ranks_count=None,
                missing_ranks_count=None,
                reported_mismatches=tuple(mismatches.get(id_, ())),
            )
            for id_, size in ids
        ),
        dead_count=dead_count,
    )


def _sections(lines: list[str]) -> Iterator[tuple[str, str]]:
    """(section, line) for each line under a title (a line underlined with '=')."""
    section = ""
    for line, nxt in zip(lines, [*lines[1:], ""], strict=True):
        if line.strip() and set(nxt.strip()) == {"="}:
            section = line.strip().split("...")[0].strip()
        else:
            yield section, line


def count_mismatches(comm: Communicator) -> dict[str, tuple[int, int]]:
    """op -> (lowest, highest) count, for each op whose ranks disagree in this report."""
    out: dict[str, tuple[int, int]] = {}
    for op in sorted({op for r in comm.ranks for op in r.counts}):
        values = {r.counts.get(op, 0) for r in comm.ranks}
        if len(values) > 1:
            out[op] = (min(values), max(values))
    return out


def status_differs(comm: Communicator) -> bool:
    return len({r.status for r in comm.ranks}) > 1
