"""Stopping a fuzz on SIGINT (Ctrl-C) or SIGTERM (a CI runner's time limit): between rounds,
with its summary and its report, never with a traceback.

The parent process takes the signal and sets a shared event; every process checks it between
rounds (`run_single`). Worker processes are started with both signals ignored, so a Ctrl-C sent
to the whole process group reaches the parent alone, and a round is never cut inside Hypothesis
(which would report a fake failure). A second signal acts as it normally does.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator, Optional

EXIT_STATUS = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal's number, as a shell reports it
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """Whether, and by which signal, the run was asked to stop; `event` is shared with workers."""

    def __init__(self, event: Any):
        self.event = event
        self.signal_name: Optional[str] = None

    def is_set(self) -> bool:
        return self.event.is_set()


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored while the block runs; processes started meanwhile inherit it."""
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def stop_on_signals(stop: StopRequest) -> Iterator[StopRequest]:
    """While the block runs, the first SIGINT or SIGTERM sets `stop` (and names itself there);
    the handlers that were in place come back for the next one, and after the block."""
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}

    def handle(signum: int, frame: Any) -> None:
        stop.signal_name = signal.Signals(signum).name
        stop.event.set()
        for other, handler in previous.items():
            signal.signal(other, handler)

    for signum in SIGNALS:
        signal.signal(signum, handle)
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
