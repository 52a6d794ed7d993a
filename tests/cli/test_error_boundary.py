"""The command line's one error boundary: the project's named errors (`models.ToyCircuitsError`) are one line and exit
2, an environment failure (a full disk: `OSError` ENOSPC / EDQUOT, or a named error that is also such an `OSError`)
one line and exit 1, an unexpected exception its traceback and exit 1; a bad option names the (sub)command whose
parser refused it. `analyses.cli.main` runs in this process, with a command added for the test."""

from __future__ import annotations

import errno
import inspect

import pytest

import models.errors as E
from analyses import cli
from analyses.cli.common import Command


def _raiser(exc: BaseException):
    def add_arguments(p):
        p.add_argument("--x")

    def run(args):
        raise exc

    return Command("boom", "raises", add_arguments, run)


def _main(capsys, monkeypatch, exc, *argv):
    monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, _raiser(exc)])
    capsys.readouterr()
    code = cli.main(["boom", *argv])
    _, err = capsys.readouterr()
    return code, err


def _named_errors() -> list[type]:
    """Every error class models.errors defines (warnings left out)."""
    return [c for _, c in inspect.getmembers(E, inspect.isclass)
            if issubclass(c, E.ToyCircuitsError) and c.__module__ == E.__name__]


def test_the_named_errors_are_found():
    assert len(_named_errors()) >= 10 and E.ConfigError in _named_errors()


@pytest.mark.parametrize("cls", _named_errors(), ids=lambda c: c.__name__)
def test_every_named_error_is_one_line_and_exit_2(cls, capsys, monkeypatch):
    if issubclass(cls, OSError):  # an environment error (DiskFullError): exit 1, below
        pytest.skip("an OSError: the machine's, not the command line's")
    code, err = _main(capsys, monkeypatch, cls("the input is bad\nsecond line"))
    assert code == 2 and err == "circuits boom: error: the input is bad\n", err


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_is_one_line_and_exit_1(number, capsys, monkeypatch):
    code, err = _main(capsys, monkeypatch, OSError(number, "No space left on device", "/out/x.png"))
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("circuits boom: failed: ") and "/out/x.png" in err


def test_a_named_error_that_is_a_full_disk_is_exit_1(capsys, monkeypatch):
    """The shape of `models.errors.DiskFullError(ToyCircuitsError, OSError)`: the machine's failure, not bad input,
    though it is one of ours."""

    class DiskFull(E.ToyCircuitsError, OSError):
        pass

    code, err = _main(capsys, monkeypatch, DiskFull(errno.ENOSPC, "No space left on device", "/out/model.safetensors"))
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err


def test_an_unexpected_exception_shows_its_traceback(capsys, monkeypatch):
    code, err = _main(capsys, monkeypatch, ZeroDivisionError("a bug"))
    assert code == 1 and "Traceback (most recent call last)" in err and "ZeroDivisionError: a bug" in err


@pytest.mark.parametrize("argv, prog", [
    (["report", "attn-only-2l", "--out", "r", "--no-such-option"], "circuits report"),
    (["heads", "attn-only-2l", "--threshold", "x"], "circuits heads"),
    (["sae", "train", "attn-only-2l", "--hook", "h", "--out", "o", "--no-such-option"], "circuits sae train"),
    (["zoo", "extra"], "circuits zoo"),
    (["--no-such-option"], "circuits"),
])
def test_a_bad_option_names_its_subcommand(argv, prog, capsys):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"{prog}: error: ") and err.count("\n") == 1, err
