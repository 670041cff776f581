#!/usr/bin/env bash
# Unsloth's wheels for the GPU machine (`make unsloth-wheel`; docs/BENCHMARKS.md, "Unsloth on the GPU
# machine"). Usage: bench/unsloth_wheels.sh OUT_DIR UV PYTHON unsloth==X unsloth-zoo==X
#
# 1. Resolve what the GPU image has (device README: Python 3.12, torch 2.11 CUDA 13, transformers 5.17,
#    peft 0.21, accelerate, pyarrow 25, tokenizers, click, tqdm, pytest) and their dependencies.
# 2. Resolve unsloth and unsloth-zoo for that image (Python 3.12, x86_64 manylinux_2_28), its torch,
#    transformers and peft held at the image's versions; index state as of EXCLUDE_NEWER.
# 3. Download, without dependencies, every wheel of (2) whose name (1) lacks into OUT_DIR, and print
#    each one's size and the total. Resolutions are kept in OUT_DIR/image.txt and OUT_DIR/unsloth.txt.
set -euo pipefail
out=${1:?OUT_DIR}; uv=${2:?UV}; py=${3:?PYTHON}; shift 3
[ "$#" -gt 0 ] || { echo "name unsloth==X unsloth-zoo==X" >&2; exit 2; }
when=${EXCLUDE_NEWER:-2026-12-06T00:00:00Z}
image="torch==2.11.0 transformers==5.17.0 peft==0.21.0 accelerate pyarrow==25.* tokenizers click tqdm pytest"
compile() { "$uv" pip compile -q --native-tls --no-header --no-annotate --python-version 3.12 \
    --python-platform x86_64-manylinux_2_28 --exclude-newer "$when" "$@"; }
rm -rf "$out" && mkdir -p "$out"
printf '%s\n' $image | compile - -o "$out/image.txt"
printf '%s\n' torch==2.11.0 transformers==5.17.0 peft==0.21.0 > "$out/held.txt"
printf '%s\n' "$@" | compile - -c "$out/held.txt" -o "$out/unsloth.txt"
# a distribution's name as PEP 503 compares them: lower case, runs of - _ . as one -
name() { awk -F'==' 'NF == 2 {n = tolower($1); gsub(/[-_.]+/, "-", n); print n}' "$1" | sort -u; }
comm -23 <(name "$out/unsloth.txt") <(name "$out/image.txt") > "$out/beyond-image.txt"
pins=$(awk -F'==' 'NR == FNR {need[$1]; next} NF == 2 {n = tolower($1); gsub(/[-_.]+/, "-", n); if (n in need) print}' \
    "$out/beyond-image.txt" "$out/unsloth.txt")
# shellcheck disable=SC2086  # a list of pins
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out" $pins 2>&1 | grep -v "is ignored" || true
echo "Unsloth's wheels beyond the GPU image ($(wc -l < "$out/beyond-image.txt") packages), largest first:"
ls -l -S "$out"/*.whl | awk '{printf "  %6.1f MB  %s\n", $5 / 1e6, $9; total += $5} END {printf "  %6.1f MB  in all (a device call carries 67.1 MB = 64 MiB, the working tree included)\n", total / 1e6}'
