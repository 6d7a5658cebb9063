#!/usr/bin/env bash
# The habits CI keeps: ruff's lint and format check over the package and the tests, mypy on the package, then the
# import contracts (import-linter).
# Uses the project's virtualenv (scripts/bootstrap.sh --dev makes it; ruff and mypy are pinned in the dev extras).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${MEMORY_VENV:-$ROOT/.venv}"
"$VENV/bin/ruff" check memory_service tests
"$VENV/bin/ruff" format --check memory_service tests
"$VENV/bin/mypy"
"$VENV/bin/lint-imports" --no-cache --no-logo  # the import contracts of pyproject.toml ([tool.importlinter])
