"""Kind ``adapter`` (stream marks, docs/integrations.md): what a framework adapter
(rankscope.rank.adapters) did in a process."""

# ruff: noqa: RUF009 (the codec's field builders return dataclasses.field()s)

from __future__ import annotations

from dataclasses import dataclass

from rankscope.record import codec
from rankscope.record.codec import Codec


@dataclass(frozen=True, slots=True)
class AdapterFailure(Codec, where="adapter.failed"):
    """The hook point that could not attach, and why."""

    hook: str | None = codec.text()
    why: str | None = codec.text()


@dataclass(slots=True, kw_only=True)
class AdapterStatus(Codec, kind="adapter", stream="marks", where="adapter"):
    """``attached`` (or ``attached_unverified_version``: a release not checked, whose every
    hook point verified at run time) with the methods it wrapped and the modules still to
    come, or ``not_attached`` / ``detached`` with what ``failed``. One line a process and
    adapter; one of no framework or status says nothing (malformed)."""

    framework: str = codec.text(required=True)
    version: str | None = codec.text()
    checked_versions: tuple[str, ...] = codec.strings()
    status: str = codec.text(required=True)  # one of the statuses the docstring names
    hooks: tuple[str, ...] = codec.strings()
    pending: tuple[str, ...] = codec.strings()
    failed: AdapterFailure | None = codec.section(AdapterFailure, optional=True)
