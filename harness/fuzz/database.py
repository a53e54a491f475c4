"""The Hypothesis engine's example database: a directory, or a Redis server shared by runners."""

from __future__ import annotations

import os
from typing import Optional

from hypothesis.database import DirectoryBasedExampleDatabase

from harness.outputs import check_output_dir
from harness.profiles import PROJECT_ROOT

DEFAULT_DIRECTORY = os.path.join(PROJECT_ROOT, ".hypothesis", "fuzz")


def check_database(spec: Optional[str]) -> None:
    """Raise ValueError naming `spec` unless the database can be used: a Redis server that
    answers (with the redis package installed), or a directory that can be created and written.
    An unreachable database is a setup error, found before any work starts."""
    if spec and spec.startswith("redis://"):
        try:
            import redis
        except ImportError:
            raise ValueError("--db redis://...: the redis package is not installed (pip install redis)") from None
        try:
            redis.Redis.from_url(spec, socket_connect_timeout=5).ping()
        except (redis.RedisError, ValueError) as exc:
            raise ValueError(f"--db {spec}: cannot reach the Redis server ({exc})") from None
    elif spec and "://" in spec:
        raise ValueError(f"--db {spec}: unknown database; give a directory or redis://host:port/n")
    else:
        check_output_dir("--db", spec or DEFAULT_DIRECTORY)


def open_database(spec: Optional[str]):
    """The example database named by `spec`: a directory, or `redis://host:port/n`."""
    if spec and spec.startswith("redis://"):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase

        return RedisExampleDatabase(redis.Redis.from_url(spec))
    return DirectoryBasedExampleDatabase(spec or DEFAULT_DIRECTORY)
