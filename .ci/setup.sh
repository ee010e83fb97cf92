#!/usr/bin/env bash
# Create .venv and install geofl into it (idempotent).
#   bash .ci/setup.sh        -> what the quickstart needs (geofl + torch + scikit-learn)
#   bash .ci/setup.sh dev    -> also the test and lint tools, psycopg, flwr
# torch is installed first and pinned: the CPU build of 2.13.0 is on local disk, while an
# unpinned torch would pull a multi-gigabyte CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || pip install "torch==2.13.0"
extras="examples"
[ "${1:-}" = "dev" ] && extras="examples,dev"
pip install -e ".[${extras}]"
echo "geofl installed in .venv ($(.venv/bin/geofl --version))"
