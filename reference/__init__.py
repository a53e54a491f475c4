"""The dict-based reference model of the hybrid radix cache (the executable specification)."""

from reference.model import ROOT, SGLANG_0_5_4, SGLANG_0_5_20, SGLANG_UNIFIED, SGLANG_UNIFIED_0_5_20, ModelMambaExhausted, ModelReq, Path, Record, ReferenceCache, Rules

__all__ = ["ROOT", "SGLANG_0_5_4", "SGLANG_0_5_20", "SGLANG_UNIFIED", "SGLANG_UNIFIED_0_5_20", "ModelMambaExhausted", "ModelReq", "Path", "Record", "ReferenceCache", "Rules"]
