#!/usr/bin/env bash
# Installs Infinity (infinity-emb, the embedding server a user would pick instead of Conduit) into a
# folder of its own ($1, default benchmarks/peers/infinity), never into the project's venv: it needs
# transformers 4.x and sentence-transformers 3.x, which Conduit's newer pins would break. Run with
# PYTHONPATH=<folder> on the venv's Python (torch and the rest come from the venv).
set -euo pipefail
target=${1:-benchmarks/peers/infinity}
pip=${PIP:-.venv/bin/pip}
test -f "$target/.installed" && exit 0
"$pip" install -q --target "$target" --no-deps "infinity-emb[server]==0.0.78" fastapi posthog \
	prometheus-fastapi-instrumentator "typer>=0.12.5,<0.13" "click<8.2" "rich<14" httptools uvloop pillow \
	"transformers==4.57.1" "sentence-transformers==3.4.1" "huggingface_hub==0.36.0" "tokenizers==0.22.1"
touch "$target/.installed"
