"""Reproducers for upstream: a failure found on SGLang as a standalone script (`to_script`)."""

from harness.reproducer.record import ScriptError
from harness.reproducer.script import to_script

__all__ = ["ScriptError", "to_script"]
