"""Counting a fuzz run (`Stats`, the machines' event sink) and showing it (`Progress`)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, TextIO

PROGRESS_SECONDS_TTY = 0.5
PROGRESS_SECONDS_LOG = 10.0


class Stats:
    """Counters of one fuzz process; `record` is the machine's event sink."""

    def __init__(self):
        self.labels: Counter = Counter()
        self.programs = 0
        self.steps = 0
        self.failures: List[Any] = []  # the buckets this process found (`harness.fuzz.buckets`)
        self.first_failure_programs: Optional[int] = None
        self.started = time.monotonic()
        self.first_failure_seconds: Optional[float] = None  # from `started` to the first failing program
        self.on_tick: Callable[[], None] = lambda: None

    def record(self, label: str) -> None:
        if label == "program":
            self.programs += 1
        elif label == "program failed":
            if self.first_failure_programs is None:
                self.first_failure_programs = self.programs
                self.first_failure_seconds = time.monotonic() - self.started
        elif label.startswith("operation: "):
            self.steps += 1
            if self.steps % 32 == 0:
                self.on_tick()
        else:
            self.labels[label] += 1


class Progress:
    """A progress bar on a terminal, plain periodic lines otherwise (CI logs)."""

    def __init__(self, budget: float, out: TextIO):
        self.budget = budget
        self.out = out
        self.tty = out.isatty()
        self.start = time.monotonic()
        self.last = 0.0

    def show(self, programs: int, steps: int, failures: int, final: bool = False) -> None:
        now = time.monotonic()
        elapsed = now - self.start
        if not final and now - self.last < (PROGRESS_SECONDS_TTY if self.tty else PROGRESS_SECONDS_LOG):
            return
        self.last = now
        rate = steps / elapsed if elapsed > 0 else 0.0
        figures = f"{elapsed:5.0f}s/{self.budget:.0f}s programs {programs} steps {steps} ({rate:.0f}/s) failures {failures}"
        if self.tty:
            done = min(1.0, elapsed / self.budget)
            bar = "#" * int(done * 24) + "." * (24 - int(done * 24))
            self.out.write(f"\r[{bar}] {figures}" + ("\n" if final else ""))
        else:
            self.out.write(f"fuzz: {figures}\n")
        self.out.flush()
