"""The probe's public API (docs/probe.md): ``mark``, ``configure``, ``arenas.register``..."""

from rankscope.rank.probe import arenas, configure, derive, mark, mark_fields, oom, publish_boot_id

__all__ = ["arenas", "configure", "derive", "mark", "mark_fields", "oom", "publish_boot_id"]
