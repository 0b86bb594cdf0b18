"""rankscope: where every byte of VRAM went on a multi-GPU inference job, who else holds
the cards, how close each card came to its floor, and whether every rank issued the same
collectives. Read a flight record (boots, phases, census), run the host daemon (serve), or
see it all work on this machine (demo). `rankscope COMMAND --help` for each."""

# Each subcommand lives in its own module, imported only when that subcommand runs, so
# `rankscope boots` never pays for torch or the web stack.

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Each module has configure_parser(p) and main(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "boots": ("rankscope.cli.boots", "list the boots recorded in a flight directory"),
    "phases": ("rankscope.cli.phases", "per-process posts between boot phases, per card"),
    "census": ("rankscope.cli.census", "per-rank collective counts and their divergence"),
    "oom": ("rankscope.cli.oom", "every OOM instant: who failed, and who held the card"),
    "serve": ("rankscope.daemon.cli", "run the host daemon (metrics, sampler, holdings)"),
    "demo": ("rankscope.demo.cli", "run a small instrumented multi-rank job end to end"),
    "run": ("rankscope.rank.run", "run a command with every Python process it starts instrumented"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    from rankscope import __version__

    parser = argparse.ArgumentParser(
        prog="rankscope", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            mod = importlib.import_module(module)
            mod.configure_parser(p, name)
            p.set_defaults(_main=mod.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args._main(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `rankscope phases DIR | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
