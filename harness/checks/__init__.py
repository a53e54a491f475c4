"""The checks run after every step, by kind, each named for what it promises.

  structure   the tree, locks, LRU lists and size counters are the model's (`structure`)
  memory      every pool slot has one owner; a node that left the tree is gone (`memory`)
  meaning     each KV slot and Mamba state was computed from the prefix it stands for (`meaning`)
  ownership   tree tensors are int64 on the pools' device, in memory of their own (`ownership`)

The release's own self-checks (its idle-time leak check and `sanity_check`) are run by its
scheduler protocol, where the release runs them. None of these calls the cache's `sanity_check`:
every check reads the cache's own state and recomputes what it promises.
"""

from harness.checks.memory import NodeReclamation, RequestHoldings, pool_conservation
from harness.checks.meaning import request_meaning, tree_meaning, tree_slots_meaning
from harness.checks.ownership import index_types, own_storage, pool_index_types
from harness.checks.structure import (
    OUTSIDE_CHECKS,
    STRUCTURAL_CHECKS,
    lock_rules,
    lru_lists,
    no_tombstone_leaf,
    sizes,
    trees_equal,
)
from harness.checks.violation import InvariantViolation

# the checks that read the tree's nodes or the tensors they hold: a cache whose nodes cannot be
# read (`CacheUnderTest.opaque`, the Rust tree core) is not checked by them
NEEDS_READABLE_NODES = frozenset(
    [check.__name__ for check in STRUCTURAL_CHECKS if check not in OUTSIDE_CHECKS]
    + ["index_types", "own_storage", "node_reclaimed"]
)

# the checks that can go on past a failure: they report one kind of instance (`what`) at a time and
# ask `tolerate(check, what)` first, so a program goes on past a failure set aside. Every other
# failure ends the program where it happens (`harness.signature`).
TOLERABLE_CHECKS = frozenset(["own_storage", "index_types", "node_reclaimed"])

__all__ = [
    "NEEDS_READABLE_NODES",
    "TOLERABLE_CHECKS",
    "OUTSIDE_CHECKS",
    "STRUCTURAL_CHECKS",
    "InvariantViolation",
    "NodeReclamation",
    "RequestHoldings",
    "index_types",
    "lock_rules",
    "lru_lists",
    "no_tombstone_leaf",
    "own_storage",
    "pool_conservation",
    "pool_index_types",
    "request_meaning",
    "sizes",
    "tree_meaning",
    "tree_slots_meaning",
    "trees_equal",
]
