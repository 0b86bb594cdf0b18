"""What every line carries: the schema version, the kind, the boot and the writer's identity,
declared once. The writer fills a :class:`RankIdentity` and a :class:`ProcessIdentity`; a
:class:`Header` is both and the line's own fields, parsed from what :func:`header_json` wrote."""

from __future__ import annotations

from dataclasses import dataclass

from rankscope.record import codec
from rankscope.record.codec import Codec, Json

SCHEMA_VERSION = 1

# The environment a writer reads (docs/probe.md).
ENV_DIR = "RANKSCOPE_DIR"
ENV_BOOT_ID = "RANKSCOPE_BOOT_ID"
ENV_TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"


@dataclass(frozen=True)
class RankIdentity(Codec):
    """Which rank wrote a line, as the launcher or the framework said (null where unsaid)."""

    rank: int | None = codec.integer()
    local_rank: int | None = codec.integer()
    world_size: int | None = codec.integer()
    tp_rank: int | None = codec.integer()
    pp_rank: int | None = codec.integer()
    runner: str | None = codec.text()


@dataclass(frozen=True)
class ProcessIdentity(Codec):
    """Who wrote a line: pid plus start ticks is the identity, never the rank."""

    host: str = codec.text(required=True)
    pid: int = codec.whole()
    start_ticks: int | None = codec.integer()
    nspid: tuple[int, ...] | None = codec.ints_tuple()
    pidns: int | None = codec.integer()


def header_json(
    kind: str,
    boot: str,
    rank: RankIdentity,
    process: ProcessIdentity,
    mono: float | None,
    wall: float,
    v: int = SCHEMA_VERSION,
) -> Json:
    """A line's header as it is written: version, kind, boot, rank, process, times."""
    return {
        "v": v,
        "kind": kind,
        "boot": boot,
        **codec.encode_fields(rank, RankIdentity),
        **codec.encode_fields(process, ProcessIdentity),
        "mono": mono,
        "wall": wall,
    }


@dataclass(frozen=True, kw_only=True)
class Header(RankIdentity, ProcessIdentity, where="header"):
    """A parsed line's header. ``file`` is where the reader found it (not on disk)."""

    v: int = codec.whole()
    kind: str = codec.text(required=True)
    boot: str = codec.text(required=True)
    wall: float = codec.time(required=True)
    mono: float | None = codec.time()
    file: str = ""

    @property
    def process_key(self) -> tuple[str, int, int | None]:
        """The identity of the writing process: (host, pid, start_ticks), never the rank."""
        return (self.host, self.pid, self.start_ticks)

    def to_json(self) -> Json:
        return header_json(self.kind, self.boot, self, self, self.mono, self.wall, self.v)
