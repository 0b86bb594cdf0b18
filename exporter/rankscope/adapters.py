"""The framework adapters' public API (docs/integrations.md); the code is in the rank's zone."""

from rankscope.rank.adapters import ADAPTERS, install_import_hooks, uninstall_import_hooks

__all__ = ["ADAPTERS", "install_import_hooks", "uninstall_import_hooks"]
