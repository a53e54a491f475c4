"""`CommandParser`: an argument parser whose errors are one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class CommandParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose `error` prints `PROG: error: MESSAGE (see --help)`, one
    line, and exits 2; subcommands' parsers are of the same kind."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)
