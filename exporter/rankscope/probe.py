"""The probe's public API (docs/probe.md): ``mark``, ``configure``, ``arenas.register``. The
probe runs inside the rank; its code is :mod:`rankscope.rank.probe`."""

from rankscope.rank.probe import (
    arenas,
    configure,
    derive,
    mark,
    mark_fields,
    oom,
    publish_boot_id,
)

__all__ = ["arenas", "configure", "derive", "mark", "mark_fields", "oom", "publish_boot_id"]
