#!/usr/bin/env bash
# Install SGLang VERSION (default 0.5.4) for the harness's sglang adapter, without SGLang's heavy
# dependency tree and without replacing the torch already installed (the CPU build here).
#   scripts/install-sglang.sh [0.5.4|0.5.20|0.5.23]
set -euo pipefail
version="${1:-0.5.4}"
here="$(cd "$(dirname "$0")/.." && pwd)"
reqs="$here/requirements/sglang-$version.txt"
[ -f "$reqs" ] || { echo "install-sglang: no requirements/sglang-$version.txt (supported: 0.5.4, 0.5.20, 0.5.23)" >&2; exit 2; }
torch_version="$(python -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" || {
  echo "install-sglang: install torch first (README, Quick start)" >&2; exit 2; }
constraints="$(mktemp)"
echo "torch==$torch_version" > "$constraints"
python -m pip install --no-deps "sglang==$version"
python -m pip install -r "$reqs" -c "$constraints"
cd "$here" && SGLANG_MAMBA_SSM_DTYPE=float32 python -c "from harness.caches.sglang_loader import sglang_version; print('sglang', sglang_version(), 'ready for --impl sglang')"
