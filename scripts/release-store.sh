#!/usr/bin/env bash
# Fill the release store for `python -m harness releases`: install the one dependency set every
# SGLang release from 0.5.3.post2 to 0.5.23 runs with (keeping the installed torch), then fetch and
# unpack each release's wheel into the store ($HARNESS_RELEASE_STORE, default
# ~/.cache/mamba-radix-harness/releases). Idempotent: what is there already is kept.
#   scripts/release-store.sh [--from V] [--to V]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
torch_version="$(python -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" || {
  echo "release-store: install torch first (README, Quick start)" >&2; exit 2; }
constraints="$(mktemp)"
echo "torch==$torch_version" > "$constraints"
python -m pip install -q -r "$here/requirements/sglang-releases.txt" -c "$constraints"
cd "$here" && python -m harness.releases.store "$@"
