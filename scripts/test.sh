#!/usr/bin/env bash
# Set up what is missing (dev extras included), then run the test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh" --dev
cd "$ROOT"
exec "${MEMORY_VENV:-$ROOT/.venv}/bin/python" -m pytest "$@"
