"""The `circuits` command line.

One registration rule: each command module (`COMMAND_MODULES`) holds `COMMANDS`, a list of `Command`s (a name, a
one-line help, a function that adds its arguments, and `run`: `run(args) -> int` for a command that reads no model,
else one `run(args, loaded) -> int` per model kind it serves); `circuits --help` lists them in that order. A new
command is one `Command` entry in the module of its group (a new group: one module here). `common.run_command` is
the one place a model is loaded for a command and a kind it does not serve refused; `_outcome` below the one error
boundary. Command modules import torch and the analyses inside `run`, so `circuits --help` stays fast.

The grammar every command keeps (docs/cli.md, held by tests/cli/test_grammar.py): `--json`, `--device`, `--seed`,
`--no-progress` everywhere; `--out` always a folder; `--figure PATH.png` and `--csv` through `common.emit`.

- `common`: `Command`, `UsageError`, the options every command shares, model loading (zoo name, folder, or a
  TransformerLens state dict with `--config`), head parsing, output and progress bars;
- `train_commands`: `zoo`, `train`, `sweep`; `model_commands`: `info`, `report`, `attention`, `generate`;
  `circuit_commands`: `heads`, `eigen`, `compose`, `paths`, `trigrams`; `patch_commands`: `patch`, `lens`;
  `discover_commands`: `discover`;
  `sae_commands`: `sae train`, `sae report` (SAELens, optional).

Exit codes: 0 ok; 2 bad usage or bad input (a one-line message on stderr, no traceback): every
`models.ToyCircuitsError` (`UsageError` included), missing or unreadable files, a read-only output folder and
command-line text that is not valid UTF-8; 1 a failure that is not the command line's: a full disk or an I/O error
(one line) or an internal bug (a traceback); 130 interrupted (Ctrl-C) and 143 terminated (SIGTERM), each with one
line, handled alike (no half-written outputs, as `KeyboardInterrupt` unwinds); 141 stdout closed early
(`circuits heads ... | head -3`), quietly, as Unix tools end on SIGPIPE. Under `torchrun` only rank 0 prints
results and errors (the other ranks exit with the same code), so `--json` stdout holds one document.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys

from . import circuit_commands, discover_commands, model_commands, patch_commands, sae_commands, train_commands
from .common import Command, UsageError, run_command, warn
from .common import rank as _rank

__all__ = ["COMMANDS", "Command", "UsageError", "build_parser", "main"]

COMMAND_MODULES = (train_commands, model_commands, circuit_commands, patch_commands, discover_commands, sae_commands)
COMMANDS: list[Command] = [c for module in COMMAND_MODULES for c in module.COMMANDS]

#: File-system errors that mean bad input rather than a bug.
_FILE_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)
#: `OSError` numbers that are the command line's to fix (exit 2) or the machine's (exit 1), each told in one line.
_USER_ERRNOS = {errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP}
_MACHINE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO}
#: Options whose text is tokenized: it must be valid UTF-8 (argv bytes that are not arrive surrogate-escaped).
_TEXT_OPTIONS = ("prompt", "text", "clean", "corrupt", "answer", "wrong")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program stands so that it unwinds as Ctrl-C does."""


def _on_sigterm(signum, frame):
    raise Terminated()


#: seconds after Python dropped an interrupt (see `Interrupts`) before it is raised again
RERAISE_S = 0.01


class Interrupts:
    """While a command runs (`with Interrupts() as it:`): SIGTERM raises `Terminated` where the program stands, and
    an interrupt (`Terminated`, Ctrl-C's `KeyboardInterrupt`) that Python drops is raised again. Python drops an
    exception raised inside a weakref callback or a `__del__` (matplotlib's transform tree uses such callbacks),
    only reporting it through `sys.unraisablehook`: the hook here, instead of printing it, asks for SIGALRM
    `RERAISE_S` later, whose handler raises the same interrupt outside the callback. `pending()` raises one the
    command outran; `settle()` forgets it (an interrupt is being reported already). Handlers, hook and timer are
    restored on the way out. Outside the main thread, or without `signal.setitimer`, only SIGTERM's handler is set
    (where it can be)."""

    def __init__(self):
        self.dropped: list[type] = []
        self.saved: list = []
        self.hook = sys.unraisablehook

    def __enter__(self) -> Interrupts:
        try:
            self.saved.append((signal.SIGTERM, signal.signal(signal.SIGTERM, _on_sigterm)))
            if hasattr(signal, "setitimer"):
                self.saved.append((signal.SIGALRM, signal.signal(signal.SIGALRM, self._again)))
                sys.unraisablehook = self._on_unraisable
        except ValueError:  # not the main thread: signals keep their handlers
            pass
        return self

    def __exit__(self, *exc) -> None:
        self.settle()
        sys.unraisablehook = self.hook
        for signum, previous in self.saved:
            signal.signal(signum, previous)

    def _again(self, signum=None, frame=None):
        raise (self.dropped.pop() if self.dropped else Terminated)()

    def _on_unraisable(self, u) -> None:
        if not isinstance(u.exc_value, KeyboardInterrupt):
            return self.hook(u)
        self.dropped.append(type(u.exc_value))
        signal.setitimer(signal.ITIMER_REAL, RERAISE_S)

    def pending(self) -> None:
        if self.dropped:
            self._again()

    def settle(self) -> None:
        if len(self.saved) == 2:
            signal.setitimer(signal.ITIMER_REAL, 0)
        self.dropped.clear()


def _check_text_options(args) -> None:
    for name in _TEXT_OPTIONS:
        value = getattr(args, name, None)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                bad = value[e.start].encode("utf-8", "surrogateescape")
                raise UsageError(f"--{name} is not valid UTF-8 (byte 0x{bad.hex()} at character {e.start}); give "
                                 "UTF-8 text") from None


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

MODEL is a zoo name, a saved model folder, or a .pth/.safetensors state dict with --config. Every command takes
--json, --device, --seed and --no-progress; --out is always a folder; analyses draw --figure PATH.png and print
tables as --csv (docs/cli.md).
Exit codes: 0 ok; 2 bad usage or input (one line); 1 a full disk or I/O error (one line) or an internal failure
(a traceback); 130 Ctrl-C, 143 SIGTERM; 141 stdout closed early. `circuits COMMAND --help` for each command."""


def build_parser(commands=None) -> argparse.ArgumentParser:
    p = _Parser(prog="circuits", description="Toy transformers and the math of transformer circuits.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for c in commands or COMMANDS:
        sp = sub.add_parser(c.name, help=c.help, description=c.help)
        c.add_arguments(sp)
        sp.set_defaults(_command=c)
        _name_parsers(sp)
    return p


def _name_parsers(parser: argparse.ArgumentParser) -> None:
    """Record in each (sub)command's parser, as the default `_parser`, the parser itself, so that an option none of
    them knows is reported by the innermost one the command line reached (`circuits sae train: error: ...`)."""
    parser.set_defaults(_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _name_parsers(child)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # bad usage: argparse prints one line naming the (sub)command and exits with 2
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "_command", None):
        parser.print_help()
        return 2
    args.argv = argv[1:]
    with Interrupts() as interrupts:
        return _run(args, interrupts)


def _run(args, interrupts: Interrupts | None = None) -> int:
    """`args._run(args)` with the exit codes of the module docstring, under `interrupts` (`Interrupts`)."""
    import warnings

    try:
        with warnings.catch_warnings():
            _notices(f"circuits {args.command}")
            _check_text_options(args)
            code = run_command(args._command, args)
            if interrupts is not None:
                interrupts.pending()
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except (Exception, KeyboardInterrupt) as e:
        if interrupts is not None:
            interrupts.settle()
        _settle()
        return _outcome(e, f"circuits {args.command}")


def _notices(where: str) -> None:
    """Inside `warnings.catch_warnings()`: a `ContextWindowWarning` (text longer than n_ctx: the model reads its
    last tokens) becomes one line on stderr, each distinct message once, whatever the warning filters say."""
    import warnings

    from models.errors import ContextWindowWarning

    said, show = set(), warnings.showwarning

    def notice(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, ContextWindowWarning):
            return show(message, category, filename, lineno, file, line)
        if str(message) not in said:
            said.add(str(message))
            warn(f"{where}: {message}")

    warnings.simplefilter("always", ContextWindowWarning)
    warnings.showwarning = notice


def _settle() -> None:
    """The outcome is decided: a later SIGTERM (torchrun stopping the other ranks) ends the process quietly instead
    of raising into the report of the first."""
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # not the main thread
        pass


def _outcome(e: BaseException, where: str) -> int:
    """Report `e` (one line, or a traceback for a bug) and return the exit code."""
    try:
        raise e
    except BrokenPipeError:
        try:  # stdout is gone: point it at /dev/null so the interpreter's own flush at exit stays quiet
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 128 + signal.SIGPIPE
    except Terminated:
        warn(f"{where}: terminated (SIGTERM)")
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        warn(f"{where}: interrupted")
        return 130
    except Exception as e:
        from models.errors import ToyCircuitsError

        msg = (str(e).splitlines() or [type(e).__name__])[0]
        if getattr(e, "errno", None) in _MACHINE_ERRNOS:  # the machine's (DiskFullError keeps its errno): exit 1
            warn(f"{where}: failed: {_os_message(e) or msg}")
            return 1
        if isinstance(e, (ToyCircuitsError, *_FILE_ERRORS)) or getattr(e, "errno", None) in _USER_ERRNOS:
            warn(f"{where}: error: {_os_message(e) or msg}")
            if _rank():  # every rank meets the same bad input: let rank 0 say so before torchrun stops it
                import time

                time.sleep(1)
            return 2
        import traceback

        prefix = f"[rank {_rank()}] " if _rank() else ""
        print(prefix + traceback.format_exc().rstrip(), file=sys.stderr)
        print(f"{prefix}{where}: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _os_message(e: BaseException) -> str | None:
    """"<strerror>: <file>" for an `OSError` carrying both (its str() starts with "[Errno N]"), else None."""
    if not isinstance(e, OSError) or isinstance(e, _FILE_ERRORS) or not e.strerror:
        return None
    return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
