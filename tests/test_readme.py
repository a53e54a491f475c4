"""The README as a new user reads it: every Python block runs, and it stays short."""

import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")
TEXT = open(README, encoding="utf-8").read()
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)


def test_the_readme_is_short_and_has_python_examples():
    assert len(TEXT.splitlines()) < 250
    assert BLOCKS


@pytest.mark.parametrize("source", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_every_python_block_of_the_readme_runs(source):
    exec(compile(source, README, "exec"), {"__name__": "readme"})
