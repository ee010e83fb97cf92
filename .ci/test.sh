#!/usr/bin/env bash
# The test suite, as the README's second command runs it (after `.ci/setup.sh dev`).
# PostgreSQL tests run when GEOFL_TEST_POSTGRES_URL is set (see .ci/postgres.sh); the
# Fashion-MNIST tests when the Debian package dataset-fashion-mnist is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
PATH="$PWD/.venv/bin:$PATH" bash .ci/typecheck
.venv/bin/python -m pytest "$@"
