"""The dict-based reference model of the hybrid radix cache (the executable specification)."""

from reference.model import ROOT, ModelMambaExhausted, ModelReq, Path, Record, ReferenceCache

__all__ = ["ROOT", "ModelMambaExhausted", "ModelReq", "Path", "Record", "ReferenceCache"]
