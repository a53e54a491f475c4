"""The seeded-bug catalogue and its runner (`python -m bench.mutants`); not imported by the product."""

from bench.mutants.catalogue import BY_NAME, MUTANTS
from bench.mutants.patch import Mutant, MutantError, applied

__all__ = ["BY_NAME", "MUTANTS", "Mutant", "MutantError", "applied"]
