"""`analyses.cli.Interrupts`: SIGTERM and Ctrl-C stop a command even when they land inside a weakref callback or a
`__del__` (matplotlib's transform tree runs such callbacks while figures are drawn and freed), where Python only
reports an exception and drops it. Before: `circuits report` could run on to the end after SIGTERM, exit 0, with
"Exception ignored in: <function TransformNode.set_children...>" on stderr (the slow test
tests/cli/test_cli_exits.py::test_sigterm_during_report_leaves_no_figures_without_report, now and then)."""

from __future__ import annotations

import os
import signal
import sys
import time
import weakref

import pytest

from analyses.cli import Interrupts, Terminated


class Thing:
    pass


def _wait_for_it() -> None:
    for _ in range(1000):  # at most 10 s; the re-raise comes 10 ms after the drop
        time.sleep(0.01)


def test_sigterm_inside_a_weakref_callback_is_raised_again(capfd):
    def callback(ref):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs here, inside the callback: Python drops its exception
            pass

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGALRM), sys.unraisablehook
    with Interrupts():
        thing = Thing()
        ref = weakref.ref(thing, callback)
        with pytest.raises(Terminated):
            del thing
            _wait_for_it()
    assert ref() is None
    assert "Exception ignored" not in capfd.readouterr().err
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGALRM), sys.unraisablehook) == before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_dropped_interrupt_the_command_outran_is_raised_by_pending():
    def callback(ref):
        raise KeyboardInterrupt

    with Interrupts() as it:
        thing = Thing()
        ref = weakref.ref(thing, callback)  # noqa: F841
        del thing  # dropped, the timer set
        with pytest.raises(KeyboardInterrupt):
            it.pending()
        it.pending()  # once
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_other_exceptions_in_callbacks_still_reach_the_previous_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(type(u.exc_value)))

    def callback(ref):
        raise ValueError("a bug in a callback")

    with Interrupts() as it:
        thing = Thing()
        ref = weakref.ref(thing, callback)  # noqa: F841
        del thing
        it.pending()  # nothing pending: a ValueError is not an interrupt
    assert seen == [ValueError]
