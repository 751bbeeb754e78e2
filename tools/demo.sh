#!/usr/bin/env bash
# The main job end to end on a small built-in example, on a fresh Debian 12 machine:
# packages and build, then synthetic slides -> tissue tiles in an LMDB store -> a CNN trained
# on them, validated on held-out slides, with a checkpoint at every epoch. It installs only what
# building and running tessera needs (tools/install-deps.sh without --tests: no PyTorch, PostgreSQL
# or Chromium) and builds only the tessera binary.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "demo.sh: installing the Debian packages that building tessera needs, then building the tessera binary"
bash tools/build.sh
work="${TESSERA_DEMO_DIR:-build/demo}"
mkdir -p "$work"
tessera=build/tools/tessera
"$tessera" info
slides=() labels=()
for seed in 1 2 3 4; do
  "$tessera" synth "$work/slide$seed.tiff" --width 6144 --height 6144 --seed "$seed" --overwrite
  slides+=("$work/slide$seed.tiff")
  labels+=("$work/slide$seed.geojson")
done
rm -rf "$work/tiles.lmdb"
# Level 2 (4x downsampled) tiles of 32 px: a small task that trains in minutes on a CPU.
"$tessera" tile "${slides[@]}" --out "$work/tiles.lmdb" --size 32 --level 2 --min-tissue 0.5 \
  --labels "${labels[@]}" --unannotated Normal --label-rule coverage --label-coverage 0.5
"$tessera" train --data "$work/tiles.lmdb" --model small-cnn --epochs 3 --batch 32 --optimizer adam \
  --lr 0.001 --val-fraction 0.25 --augment --checkpoint "$work/small-cnn.h5" --overwrite   # names the checkpoint at the end
