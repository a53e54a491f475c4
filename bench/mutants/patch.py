"""`Mutant`: one seeded bug in `impl/`, a small textual patch of one function applied at run time.

A mutant names a function (`module:Class.method` or `module:function`) and one or more
`(old, new)` edits of its source. `applied(mutant)` compiles the edited source in the function's
own module globals and puts it in place of the original until the block ends; nothing on disk
changes. An edit whose `old` text is not found exactly once is refused with `MutantError`, so a
catalogue entry that no longer fits the code says so instead of silently testing nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Tuple

from strategies.config import Serving


class MutantError(ValueError):
    """A mutant that cannot be applied to the current `impl` source; names the mutant and why."""


@dataclass(frozen=True)
class Mutant:
    """A named single-point bug: `edits` applied to the source of `target`."""

    name: str
    area: str
    target: str  # "impl.module:Class.method" or "impl.module:function"
    edits: Tuple[Tuple[str, str], ...]
    why: str  # what the bug does, in one line
    # the server settings of the path it breaks, when impl's own pools and hand-written protocol
    # cannot run them (the extra buffer, pages): hunted inside SGLang's own scheduler with them
    serving: Optional[Serving] = None

    def owner_and_attr(self) -> Tuple[Any, str]:
        """The object holding the target (a class or a module) and the attribute name."""
        module_name, _, qualname = self.target.partition(":")
        if not qualname:
            raise MutantError(f"mutant {self.name}: target {self.target!r} is not 'module:qualname'")
        owner: Any = importlib.import_module(module_name)
        *path, attr = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        if attr not in vars(owner):
            raise MutantError(f"mutant {self.name}: {self.target!r} has no attribute {attr!r}")
        return owner, attr

    def patched_source(self) -> str:
        """The target's source with every edit applied (edits use the file's indentation)."""
        owner, attr = self.owner_and_attr()
        function = inspect.unwrap(_function_of(vars(owner)[attr]))
        source = inspect.getsource(function)
        for old, new in self.edits:
            count = source.count(old)
            if count != 1:
                raise MutantError(
                    f"mutant {self.name}: {old!r} occurs {count} times in {self.target}, expected once"
                )
            source = source.replace(old, new)
        return textwrap.dedent(source)

    def build(self) -> Any:
        """The mutated replacement for the target (a function, or a staticmethod/classmethod)."""
        owner, attr = self.owner_and_attr()
        original = vars(owner)[attr]
        function = _function_of(original)
        if function.__code__.co_freevars:
            raise MutantError(
                f"mutant {self.name}: {self.target} closes over {function.__code__.co_freevars}; "
                f"only plain functions can be patched"
            )
        namespace: dict = {}
        code = compile(self.patched_source(), f"<mutant {self.name}: {self.target}>", "exec")
        exec(code, function.__globals__, namespace)
        return namespace[function.__name__]


def _function_of(attribute: Any) -> Any:
    function = getattr(attribute, "__func__", attribute)
    if not inspect.isfunction(function):
        raise MutantError(f"{attribute!r} is not a function")
    return function


@contextlib.contextmanager
def applied(mutant: Mutant) -> Iterator[None]:
    """Run the block with `mutant` in place; the original is back afterwards, whatever happens."""
    owner, attr = mutant.owner_and_attr()
    original = vars(owner)[attr]
    replacement = mutant.build()
    setattr(owner, attr, replacement)
    try:
        yield
    finally:
        setattr(owner, attr, original)
