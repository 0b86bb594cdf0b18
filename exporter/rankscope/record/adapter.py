"""Kind ``adapter`` (stream marks, docs/integrations.md): what a framework adapter
(rankscope.rank.adapters) did in a process."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rankscope.record import codec
from rankscope.record.codec import Bad, Codec, Json


@dataclass(slots=True)
class AdapterStatus(Codec):
    """``attached`` (or ``attached_unverified_version``: a release not checked, whose every
    hook point verified at run time) with the methods it wrapped and the modules still to
    come, or ``not_attached`` / ``detached`` with the hook point that could not attach and why (on the
    wire a nested ``failed``: {hook, why}, null when none). One line a process and adapter;
    one of no framework or status says nothing (malformed)."""

    KIND: ClassVar[str] = "adapter"
    STREAM: ClassVar[str] = "marks"
    WHERE: ClassVar[str] = "adapter"

    framework: str = codec.text(required=True)
    status: str = codec.text(required=True)  # one of the statuses the docstring names
    version: str | None = codec.text()
    checked_versions: tuple[str, ...] = codec.strings()
    hooks: tuple[str, ...] = codec.strings()
    pending: tuple[str, ...] = codec.strings()
    failed_hook: str | None = None
    failed_why: str | None = None

    def to_json(self) -> Json:
        failed = None
        if self.failed_hook is not None:
            failed = {"hook": self.failed_hook, "why": self.failed_why}
        return {
            "framework": self.framework,
            "version": self.version,
            "checked_versions": list(self.checked_versions),
            "status": self.status,
            "hooks": list(self.hooks),
            "pending": list(self.pending),
            "failed": failed,
        }

    @classmethod
    def parse(cls, obj: Mapping[str, Any], bad: Bad) -> AdapterStatus | None:
        values = codec.parse_fields(cls, obj, bad)
        if values is None:
            return None
        failed = codec.as_object(obj.get("failed"), bad, "adapter.failed")
        return cls(
            **values,
            failed_hook=codec.as_text(failed.get("hook"), bad, "adapter.failed.hook"),
            failed_why=codec.as_text(failed.get("why"), bad, "adapter.failed.why"),
        )
