"""Kind ``adapter`` (stream marks, docs/integrations.md): what a framework adapter
(rankscope.rank.adapters) did in a process."""

# ruff: noqa: RUF009 (the codec's field builders return dataclasses.field()s)

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rankscope.record import codec
from rankscope.record.codec import Codec


@dataclass(frozen=True, slots=True)
class AdapterFailure(Codec):
    """The hook point that could not attach, and why."""

    WHERE: ClassVar[str] = "adapter.failed"
    hook: str | None = codec.text()
    why: str | None = codec.text()


@dataclass(slots=True, kw_only=True)
class AdapterStatus(Codec):
    """``attached`` (or ``attached_unverified_version``: a release not checked, whose every
    hook point verified at run time) with the methods it wrapped and the modules still to
    come, or ``not_attached`` / ``detached`` with what ``failed``. One line a process and
    adapter; one of no framework or status says nothing (malformed)."""

    KIND: ClassVar[str] = "adapter"
    STREAM: ClassVar[str] = "marks"
    WHERE: ClassVar[str] = "adapter"

    framework: str = codec.text(required=True)
    version: str | None = codec.text()
    checked_versions: tuple[str, ...] = codec.strings()
    status: str = codec.text(required=True)  # one of the statuses the docstring names
    hooks: tuple[str, ...] = codec.strings()
    pending: tuple[str, ...] = codec.strings()
    failed: AdapterFailure | None = codec.section(AdapterFailure, optional=True)
