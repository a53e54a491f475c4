"""Errors the cache and its pools raise when they are misused or run out of room.

Every error names the offending value. A misuse error is raised before the cache or pool is
changed, so the state after the error is the state before the call.
"""


class CacheMisuseError(ValueError):
    """A call whose arguments break the API contract (bad key, bad value, bad lock use)."""


class SlotError(RuntimeError):
    """A pool slot freed while not allocated, freed twice, or the reserved slot handed out."""


class MambaPoolExhaustedError(RuntimeError):
    """No Mamba slot could be found even after evicting Mamba states (the seed's assert)."""
