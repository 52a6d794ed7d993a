"""The `circuits` command line.

One registration rule: each command module (`COMMAND_MODULES`) holds `COMMANDS`, a list of `Command`s (a name, a
one-line help, a function that adds its arguments and `run(args) -> int`); `circuits --help` lists them in that
order. A new command is one `Command` entry in the module of its group (a new group: one module here). Command
modules import torch and the analyses inside `run`, so `circuits --help` stays fast.

- `common`: `Command`, `UsageError`, the options every command shares, model loading (zoo name, folder, or a
  TransformerLens state dict with `--config`), head parsing, output and progress bars;
- `train_commands`: `zoo`, `train`; `model_commands`: `info`, `report`, `attention`, `generate`;
  `circuit_commands`: `heads`, `eigen`, `compose`, `paths`, `trigrams`; `patch_commands`: `patch`, `lens`.

Exit codes: 0 ok; 2 bad usage or bad input (a one-line message on stderr, no traceback): every
`models.ToyCircuitsError` (`UsageError` included) and missing or unreadable files; 1 internal failure.
"""

from __future__ import annotations

import argparse
import sys

from . import circuit_commands, model_commands, patch_commands, train_commands
from .common import Command, UsageError

__all__ = ["COMMANDS", "Command", "UsageError", "build_parser", "main"]

COMMAND_MODULES = (train_commands, model_commands, circuit_commands, patch_commands)
COMMANDS: list[Command] = [c for module in COMMAND_MODULES for c in module.COMMANDS]

#: File-system errors that mean bad input rather than a bug.
_FILE_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


class _Parser(argparse.ArgumentParser):
    """Bad usage: one line on stderr (pointing at --help) and exit code 2, instead of the full usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


EPILOG = """examples:
  circuits zoo                                   the shipped models
  circuits report attn-only-2l --out report      full report: markdown + figures
  circuits heads attn-only-2l                    induction / previous-token / copying heads
  circuits compose attn-only-2l --kind k         K-composition scores minus the random baseline
  circuits info old.pth --config config.json     a legacy TransformerLens state dict

MODEL is a zoo name, a saved model folder, or a .pth/.safetensors state dict with --config.
Exit codes: 0 ok, 2 bad usage or input, 1 internal failure. `circuits COMMAND --help` for each command."""


def build_parser(commands=None) -> argparse.ArgumentParser:
    p = _Parser(prog="circuits", description="Toy transformers and the math of transformer circuits.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for c in commands or COMMANDS:
        sp = sub.add_parser(c.name, help=c.help, description=c.help)
        c.add_arguments(sp)
        sp.set_defaults(_run=c.run)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)  # bad usage: argparse prints one line and exits with 2
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    args.argv = argv[1:]
    try:
        return args._run(args)
    except KeyboardInterrupt:
        print("circuits: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from models.errors import ToyCircuitsError

        if isinstance(e, (ToyCircuitsError, *_FILE_ERRORS)):
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            print(f"circuits {args.command}: error: {msg}", file=sys.stderr)
            return 2
        import traceback

        traceback.print_exc()
        print(f"circuits {args.command}: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
