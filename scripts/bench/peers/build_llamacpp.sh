#!/usr/bin/env bash
# Build llama.cpp's own server (llama-server) for this CPU, from the llama.cpp tree vendored in
# PyPI's llama-cpp-python sdist (pinned by hash in requirements-peers-src.txt), and install it
# as $VENV/bin/llama-server. No prebuilt llama-server is on PyPI or in Debian bookworm.
#
#   scripts/bench/peers/build_llamacpp.sh     # what `make peers` runs: 5-8 minutes on 2 cores
#
# Flags: Release, GGML_NATIVE=ON (-march=native: AVX-512, AVX-512 VNNI/BF16 where the CPU has
# them, as a user building llama.cpp on this machine gets), OpenMP threads (llama.cpp's default),
# static, no curl/OpenSSL/web UI (nothing is downloaded at build or run time). AMX is left out
# (-mno-amx-*): ggml's AMX backend segfaults in ggml_backend_amx_mul_mat at the first inference on
# this machine's Sapphire Rapids vCPUs (llama.cpp issue 20824, open), for every model we tried;
# without it Q4_0 weights go through ggml's AVX-512 repacked kernels (CPU_REPACK). Does nothing
# when the installed binary was built from the same pin with the same flags for the same CPU.
# The build and its result are kept outside the clone (LLAMACPP_BUILD, default
# ~/.cache/phi3-chat/llamacpp): a fresh clone on a machine that built this pin for this CPU
# installs the kept binary in a second instead of building again (CI runs on a fresh clone;
# on a CPU without AVX-512 the build took about 40 minutes of a 90-minute CI run).
set -euo pipefail
cd "$(dirname "$0")/../../.."

VENV=${VENV:-.venv}
BUILD=${LLAMACPP_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/phi3-chat/llamacpp}
JOBS=${JOBS:-$(nproc)}
PIN=requirements-peers-src.txt
FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=ON
  -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_CURL=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
)
out="$VENV/bin/llama-server"
stamp="$VENV/.llama-server.stamp"
# The CPU's vector extensions name the build (-march=native). awk, not grep: a CPU with no
# AVX-512 or AMX flag has none to find, and grep's exit 1 would stop this script (pipefail).
cpu=$(awk '/^flags/ { for (i = 2; i <= NF; i++) if ($i ~ /^(avx|amx|fma|f16c)/) print $i; exit }' \
  /proc/cpuinfo | sort -u | tr '\n' ' ')
want="$(cat "$PIN" "$0" | sha256sum | cut -d' ' -f1) $cpu"
if [ -x "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "llama-server is up to date: $out"
  exit 0
fi
kept="$BUILD/llama-server"
if [ -x "$kept" ] && [ "$(cat "$kept.stamp" 2>/dev/null)" = "$want" ]; then
  install -m 755 "$kept" "$out"
  echo "$want" >"$stamp"
  echo "installed the kept build: $out (from $kept)"
  exit 0
fi

began=$(date +%s)
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
"$VENV/bin/python" -m pip download --quiet --no-deps --no-binary :all: --require-hashes \
  -r "$PIN" -d "$BUILD/sdist"
sdist=$(ls "$BUILD"/sdist/llama_cpp_python-*.tar.gz)
# Unpacked again only for another sdist: the cmake tree then rebuilds only what changed.
if [ "$(cat "$BUILD/src/.sdist" 2>/dev/null)" != "$(sha256sum <"$sdist")" ]; then
  rm -rf "$BUILD/src" "$BUILD/cmake"
  mkdir -p "$BUILD/src"
  tar -xzf "$sdist" -C "$BUILD/src" --strip-components=1
  sha256sum <"$sdist" >"$BUILD/src/.sdist"
fi
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
# The tree has no .git: keep cmake's build-info from reading this repository's instead.
GIT_CEILING_DIRECTORIES="$BUILD" cmake -S "$BUILD/src/vendor/llama.cpp" -B "$BUILD/cmake" \
  "${generator[@]}" "${FLAGS[@]}" >"$BUILD/configure.log"
cmake --build "$BUILD/cmake" --target llama-server -j "$JOBS" >"$BUILD/build.log"
install -m 755 "$BUILD/cmake/bin/llama-server" "$out"
install -m 755 "$BUILD/cmake/bin/llama-server" "$kept"
echo "$want" >"$kept.stamp"
echo "$want" >"$stamp"
echo "built $out in $(( $(date +%s) - began )) s (${FLAGS[*]})"
