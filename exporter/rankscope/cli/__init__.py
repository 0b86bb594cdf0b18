"""rankscope: where every byte of VRAM went on a multi-GPU inference job, who else holds
the cards, how close each card came to its floor, and whether every rank issued the same
collectives. Read a flight record (boots, phases, census), run the host daemon (serve), or
see it all work on this machine (demo). `rankscope COMMAND --help` for each."""

# Each subcommand lives in its own module, imported only when that subcommand runs, so
# `rankscope boots` never pays for torch or the web stack.

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import sys
from typing import Any

# name -> (module, one-line help). Each module has configure_parser(p) and main(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "boots": ("rankscope.cli.boots", "list the boots recorded in a flight directory"),
    "phases": ("rankscope.cli.phases", "per-process posts between boot phases, per card"),
    "census": ("rankscope.cli.census", "per-rank collective counts and their divergence"),
    "oom": ("rankscope.cli.oom", "every OOM instant: who failed, and who held the card"),
    "prune": ("rankscope.cli.prune", "remove the flight files of old boots (--dry-run lists them)"),
    "serve": ("rankscope.daemon.cli", "run the host daemon (metrics, sampler, holdings)"),
    "demo": ("rankscope.demo.cli", "run a small instrumented multi-rank job end to end"),
    "run": ("rankscope.rank.run", "run a command with every Python process it starts instrumented"),
}


class Parser(argparse.ArgumentParser):
    """Reports a flag unknown to the chosen subcommand with that subcommand's usage and a hint."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            command: argparse.ArgumentParser = getattr(parsed, "_parser", self)
            command.error(unrecognized(unknown, command, getattr(parsed, "_synonyms", {})))
        return parsed


def unrecognized(
    unknown: list[str], parser: argparse.ArgumentParser, synonyms: dict[str, str]
) -> str:
    """argparse's message for ``unknown`` arguments, with a suggestion for each flag among
    them: its synonym in ``synonyms`` (--port: --web.listen-address), else the closest of
    ``parser``'s flags, whole or by the part after its last dot (--floor: --corridor.floor)."""
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    by_name = {"--" + o.rsplit(".", 1)[1]: o for o in options if "." in o}
    by_name.update({o: o for o in options})  # a flag's own name before another's last part
    message = "unrecognized arguments: " + " ".join(unknown)
    for flag in (arg.split("=", 1)[0] for arg in unknown if arg.startswith("-")):
        close = difflib.get_close_matches(flag, by_name, n=1, cutoff=0.6)
        meant = synonyms.get(flag) or (close[0] if close else None)
        if meant is not None:
            message += f"\n  {flag}: did you mean {by_name.get(meant, meant)}?"
    return message


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    from rankscope import __version__

    parser = Parser(
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
            # A wrong flag is reported against this parser, with the module's synonyms.
            p.set_defaults(_main=mod.main, _parser=p, _synonyms=getattr(mod, "SYNONYMS", {}))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        with output_for(args):
            return int(args._main(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `rankscope phases DIR | head`
        return 0


def output_for(args: argparse.Namespace) -> contextlib.AbstractContextManager[None]:
    """Control characters escaped where the command prints what a flight record holds."""
    if not getattr(args, "_printable_output", False):
        return contextlib.nullcontext()
    from rankscope.cli.common import printable_output

    return printable_output()
