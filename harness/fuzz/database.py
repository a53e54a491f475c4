"""The Hypothesis engine's example database: a directory, or a Redis server shared by runners."""

from __future__ import annotations

import os
from typing import Optional

from hypothesis.database import DirectoryBasedExampleDatabase

from harness.profiles import PROJECT_ROOT


def open_database(spec: Optional[str]):
    """The example database named by `spec`: a directory, or `redis://host:port/n`."""
    if spec and spec.startswith("redis://"):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase

        return RedisExampleDatabase(redis.Redis.from_url(spec))
    return DirectoryBasedExampleDatabase(spec or os.path.join(PROJECT_ROOT, ".hypothesis", "fuzz"))
