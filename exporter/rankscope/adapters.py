"""The framework adapters' public API (docs/integrations.md). They run inside the rank;
their code is :mod:`rankscope.rank.adapters`."""

from rankscope.rank.adapters import ADAPTERS, install_import_hooks, uninstall_import_hooks

__all__ = ["ADAPTERS", "install_import_hooks", "uninstall_import_hooks"]
