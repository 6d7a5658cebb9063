#!/usr/bin/env bash
# Set up what is missing, then serve: llama-server + the API on 127.0.0.1:8700.
# On a warm cache the set-up takes seconds (its last line says so); a fresh machine: see README's set-up.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MEMORY_BOOTSTRAP_MODELS="${MEMORY_MODEL:-default}" bash "$ROOT/scripts/bootstrap.sh"
exec "${MEMORY_VENV:-$ROOT/.venv}/bin/memory-service" serve "$@"
