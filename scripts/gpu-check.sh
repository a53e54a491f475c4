#!/usr/bin/env bash
# The checks that need a CUDA device, in one short run: the cache-level tests, the state machine
# and the regression traces on cuda, a short fuzz, and every benchmark command unchanged but for
# --device. Each step has its own time limit (together 410 s, so give a wrapping timeout
# more than that) and a failing step does not stop the others; the exit status is 1 when any
# step failed.
#   scripts/gpu-check.sh [OUTDIR]        (default gpu-check/; DEVICE=cuda by default)
# OUTDIR receives every step's output as it runs (log, kept even if the run is killed), each
# benchmark's JSON and the fuzz report: six files, and the traces of any fuzz failure. The fuzz
# database goes to a temporary folder.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-check}"
device="${DEVICE:-cuda}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 SGLANG_MAMBA_SSM_DTYPE=float32
failed=()

step() {  # step NAME SECONDS COMMAND...
    local name="$1" limit="$2" started rc
    shift 2
    echo "=== $name (limit ${limit} s): $*" | tee -a "$out/log"
    started=$(date +%s)
    timeout "$limit" "$@" 2>&1 | tee -a "$out/log"
    rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $(( $(date +%s) - started )) s" | tee -a "$out/log"
    [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
}

python -c "import torch, hypothesis, sys; print('python', sys.version.split()[0], '| torch', torch.__version__, \
'| hypothesis', hypothesis.__version__, '| device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')" \
    2>&1 | tee -a "$out/log"

step tests 100 python -m pytest -q -p no:cacheprovider -n "${WORKERS:-16}" --device "$device" --hypothesis-profile dev \
    --durations 5 tests/test_state_machine.py tests/test_regressions.py tests/test_pools.py \
    tests/test_cache_scenarios.py tests/test_traces.py tests/test_scheduler_demo.py tests/test_harness_bites.py \
    tests/test_device_placement.py
step workload 100 python -m bench.workload --device "$device" --repeats 3 --json "$out/workload.json"
step mutants 80 python -m bench.mutants --device "$device" --workers "${WORKERS:-16}" --json "$out/mutants.json"
step throughput 50 python -m bench.throughput --device "$device" --seconds 3 --json "$out/throughput.json"
step engines 30 python -m bench.engines --device "$device" --rounds 2 --seconds 4 --json "$out/engines.json"
step fuzz 50 python -m harness fuzz --device "$device" --seconds 20 --workers 8 --db "$(mktemp -d)" \
    --trace-dir "$out/traces" --report "$out/fuzz.json"

if [ "${#failed[@]}" -eq 0 ]; then
    echo "gpu-check on $device: every step passed" | tee -a "$out/log"
else
    echo "gpu-check on $device: failed: ${failed[*]}" | tee -a "$out/log"
    exit 1
fi
