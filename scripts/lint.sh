#!/usr/bin/env bash
# The habits CI keeps: ruff's lint and format check over the package and the tests, then mypy on the package.
# Uses the project's virtualenv (scripts/bootstrap.sh --dev makes it; ruff and mypy are pinned in the dev extras).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${MEMORY_VENV:-$ROOT/.venv}"
"$VENV/bin/ruff" check memory_service tests
"$VENV/bin/ruff" format --check memory_service tests
"$VENV/bin/mypy"
