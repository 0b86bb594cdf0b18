"""Ships rankscope-auto.pth into site-packages (the wheel's root) with every install,
editable included; everything else is in pyproject.toml. The .pth arms a Python process only
when RANKSCOPE_AUTO is set (docs/architecture.md, "Zero-touch")."""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

# One line that site.py executes at every interpreter start: one environment lookup when
# unarmed, and no rankscope import. Kept as a file so the tests install the very same line.
PTH_NAME = "rankscope-auto.pth"
PTH_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exporter", PTH_NAME)


class BuildPyWithPth(build_py):
    """build_py that also writes the .pth: into build_lib (the wheel's root, site-packages
    once installed), or for an editable install into the editable wheel's root, which
    setuptools names as install_lib (build_lib is discarded there)."""

    def run(self) -> None:
        super().run()
        root = self._pth_root()
        self.mkpath(root)
        self.copy_file(PTH_SOURCE, os.path.join(root, PTH_NAME))

    def _pth_root(self) -> str:
        if getattr(self, "editable_mode", False):
            return str(self.get_finalized_command("install").install_lib)
        return str(self.build_lib)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            outputs.append(os.path.join(self.build_lib, PTH_NAME))
        return outputs


setup(cmdclass={"build_py": BuildPyWithPth})
