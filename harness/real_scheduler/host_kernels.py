"""The paged KV allocator's Triton kernels, run on the host.

0.5.16 .. 0.5.21's `PagedTokenToKVPoolAllocator` launches `alloc_extend_kernel` and
`alloc_decode_kernel` whatever the device (0.5.22 on pick `alloc_extend_naive` /
`alloc_decode_naive` where the platform has no Triton). On a CPU-only machine each launch is
replaced by what the kernel writes, as those releases' own `alloc_extend_naive` and 0.5.22's
`alloc_decode_naive` write it, with one difference the kernels have: launched before the
allocator knows the free pages suffice (it returns None after), a kernel short of pages writes
garbage, so a short launch here writes -1.
"""

from __future__ import annotations

from typing import Any

import torch


class HostKernel:
    """A stand-in for `kernel[(grid,)](*args)`: calls `write(*args)`."""

    def __init__(self, write: Any):
        self.write = write

    def __getitem__(self, grid: Any) -> Any:
        return self.write


def _short(free_pages: torch.Tensor, needed: torch.Tensor, out_indices: torch.Tensor) -> bool:
    if int(needed.sum()) <= free_pages.numel():
        return False
    out_indices.fill_(-1)
    return True


def host_extend_kernel(naive: Any) -> HostKernel:
    """`alloc_extend_kernel` as the release's `alloc_extend_naive` writes it."""

    def write(prefix_lens, seq_lens, last_loc, free_pages, out_indices, _bs_upper, page_size):
        needed = (seq_lens + page_size - 1) // page_size - (prefix_lens + page_size - 1) // page_size
        if not _short(free_pages, needed, out_indices):
            naive(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, out_indices.device)

    return HostKernel(write)


def host_decode_kernel() -> HostKernel:
    """`alloc_decode_kernel`: each request's next slot after `last_loc`, or the first slot of
    the next free page (in the batch's order) when its new token starts a page."""

    def write(seq_lens, last_loc, free_pages, out_indices, _bs_upper, page_size):
        starts = ((seq_lens - 1) % page_size == 0).to(torch.int64)
        if _short(free_pages, starts, out_indices):
            return
        rank = torch.cumsum(starts, 0) - starts
        first = free_pages[rank.clamp(max=max(free_pages.numel() - 1, 0))] * page_size if free_pages.numel() else last_loc
        out_indices.copy_(torch.where(starts.bool(), first, last_loc + 1))

    return HostKernel(write)


def run_paged_kernels_on_the_host(device: str) -> None:
    """On a host device, the paged allocator of a release that launches Triton whatever the
    platform (no `use_triton_kernels`) launches the stand-ins instead; a no-op elsewhere."""
    from sglang.srt.mem_cache.allocator import paged

    picks_itself = "use_triton_kernels" in paged.PagedTokenToKVPoolAllocator.__init__.__code__.co_names
    if torch.device(device).type != "cpu" or picks_itself:
        return
    paged.alloc_extend_kernel = host_extend_kernel(paged.alloc_extend_naive)
    paged.alloc_decode_kernel = host_decode_kernel()
