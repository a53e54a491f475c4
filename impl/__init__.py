"""The hybrid (full-attention KV + Mamba state) radix prefix cache and the torch pools it manages.

Same public API as SGLang's `MambaRadixCache` (0.5.4) and its pools; see the README for the rules.
"""

from impl.errors import CacheMisuseError, MambaPoolExhaustedError, SlotError
from impl.kv_allocator import TokenToKVPoolAllocator
from impl.mamba_pool import MambaPool
from impl.mamba_radix_cache import CacheInvariantError, MambaRadixCache, MatchResult
from impl.radix_key import RadixKey
from impl.req import Req
from impl.req_to_token_pool import HybridReqToTokenPool
from impl.tree_node import TreeNode

__version__ = "0.1.0"

__all__ = [
    "CacheInvariantError",
    "CacheMisuseError",
    "HybridReqToTokenPool",
    "MambaPool",
    "MambaPoolExhaustedError",
    "MambaRadixCache",
    "MatchResult",
    "RadixKey",
    "Req",
    "SlotError",
    "TokenToKVPoolAllocator",
    "TreeNode",
]
