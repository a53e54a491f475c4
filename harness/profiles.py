"""The Hypothesis profiles of this project, importable by pytest's conftest and the fuzz command.

  dev      quick local runs, with the local example database
  ci       what CI runs: Hypothesis' built-in `ci` profile (derandomized, no database) plus our sizes
  nightly  long programs, many examples, random, a database kept between runs ($HARNESS_DB)
  mutation what mutmut runs for each of its mutants: the ci profile's derandomized programs, fewer
           of them and no shrinking (a mutant only needs to fail), so a mutant costs seconds

None of them runs Hypothesis' `explain` phase (see `REPORTING_PHASES`).
"""

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A program's smallest form already draws pools, server settings and several operations, and an
# operation a set-aside finding avoids is drawn again (`harness.program`): the base example is
# large by design, not by a strategy's mistake.
STATEFUL_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much, HealthCheck.large_base_example]
# Every phase but `explain`: on a shrunk state-machine program it only adds "or any other
# generated value" comments, and it replays the program variant by variant: with Hypothesis 6.170,
# reporting a planted bug on the medium configuration took 60 s with it and 9 s without.
REPORTING_PHASES = tuple(phase for phase in Phase if phase is not Phase.explain)
PROFILES = ("dev", "ci", "nightly", "mutation")


def _register(name: str, parent: str, phases=REPORTING_PHASES, **budget) -> None:
    settings.register_profile(
        name,
        parent=settings.get_profile(parent),
        deadline=None,
        suppress_health_check=STATEFUL_HEALTH,
        phases=phases,
        **budget,
    )


def register_profiles() -> None:
    """Register dev, ci, nightly and mutation (each with an explicit parent)."""
    _register("dev", "default", max_examples=40, stateful_step_count=40)
    _register("ci", "ci", max_examples=60, stateful_step_count=50)
    _register(
        "mutation", "ci", max_examples=8, stateful_step_count=40, phases=(Phase.explicit, Phase.reuse, Phase.generate)
    )
    _register(
        "nightly",
        "default",
        max_examples=2000,
        stateful_step_count=200,
        derandomize=False,
        database=DirectoryBasedExampleDatabase(
            os.environ.get("HARNESS_DB", os.path.join(PROJECT_ROOT, ".hypothesis", "examples"))
        ),
    )
