#!/usr/bin/env bash
# Build llama.cpp's llama-server, the benchmark peer, from the llama.cpp tree vendored in
# the llama-cpp-python sdist (PyPI is the only source reachable here). Idempotent: does
# nothing once benchmarks/peers/llama-server exists. JOBS=1 lowers peak memory.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
peers="$here/peers"
binary="$peers/llama-server"
python="${PYTHON:-$here/../.venv/bin/python}"
jobs="${JOBS:-2}"

if [[ -x "$binary" ]]; then
    echo "llama-server already built: $binary"
    exit 0
fi

mkdir -p "$peers/src"
if ! ls "$peers"/src/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    "$python" -m pip download --no-deps --no-binary :all: llama-cpp-python -d "$peers/src"
fi
sdist="$(ls "$peers"/src/llama_cpp_python-*.tar.gz | sort -V | tail -n 1)"
tree="${sdist%.tar.gz}"
[[ -d "$tree" ]] || tar -xzf "$sdist" -C "$peers/src"

llama="$tree/vendor/llama.cpp"
cd "$llama"
cmake -B build -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
cmake --build build --target llama-server -j"$jobs"
ln -sf "$llama/build/bin/llama-server" "$binary"
echo "built: $binary -> $(readlink "$binary")"
