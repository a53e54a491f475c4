#!/usr/bin/env bash
# mutmut over the cache's core: every function of impl/mamba_radix_cache.py that the state
# machine drives (match, insert, split, lock, evict, evict_mamba, cow, chunked prefill, finish),
# then their summary. `mutmut run` alone mutates all of impl/ (1,637 mutants: about 7 minutes on
# 2 cores), the recorded run (docs/mutation.md).
#   scripts/mutmut-core.sh [--max-children N]
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1  # mutants run in forked processes: no intra-op thread pools
cache='impl.mamba_radix_cache.xǁMambaRadixCacheǁ'
patterns=()
for fn in _insert_helper cache_unfinished_req cache_finished_req match_prefix _match_prefix_helper \
          dec_lock_ref _evict_leaf evict_mamba insert inc_lock_ref _copy_mamba_to_req _split_node \
          evict _delete_node _free_batched _refresh_path; do
    patterns+=("${cache}${fn}__mutmut_*")
done
patterns+=('impl.mamba_radix_cache.x__is_evictable_leaf__mutmut_*' 'impl.mamba_radix_cache.x__is_evictable_mamba__mutmut_*')
python -m mutmut run "$@" "${patterns[@]}"
python -m bench.mutation_report --only "${patterns[@]}" --json docs/mutation-core.json \
    --out "${TMPDIR:-/tmp}/mutation-core-survivors.md"
