#!/usr/bin/env bash
# The main job end to end on a small built-in example, on a fresh Debian 12 machine:
# packages and build, then synthetic slides -> tissue tiles in an LMDB store -> a CNN trained
# on them, validated on held-out slides, with a checkpoint at every epoch. It installs only what
# building and running tessera needs (tools/install-deps.sh without --tests: no PyTorch, PostgreSQL
# or Chromium) and builds only the tessera binary.
#   bash tools/demo.sh               installs, builds, then runs build/tools/tessera in build/demo
#   bash tools/demo.sh --installed   runs the tessera on PATH (the Debian package's) in ./tessera-demo,
#                                    installing and building nothing (tools/check-package.sh)
# TESSERA_DEMO_DIR names another folder. Each step prints its exit status and seconds.
set -euo pipefail
case "${1:-}" in
  "")
    cd "$(dirname "$0")/.."
    echo "demo.sh: installing the Debian packages that building tessera needs, then building the tessera binary"
    bash tools/build.sh
    tessera=build/tools/tessera
    work="${TESSERA_DEMO_DIR:-build/demo}" ;;
  --installed)
    tessera=$(command -v tessera) || { echo "demo.sh: no tessera on PATH (apt install ./tessera_*.deb)" >&2; exit 2; }
    work="${TESSERA_DEMO_DIR:-tessera-demo}" ;;
  *) echo "demo.sh: unknown option '$1' (--installed)" >&2; exit 2 ;;
esac
mkdir -p "$work"

# step NAME COMMAND...: runs the command, then says how it ended and how long it took; the demo
# stops at the first failure with its exit status.
step() {
  local name=$1 start=${EPOCHREALTIME//[!0-9]/} status=0
  shift
  "$@" || status=$?
  local tenths=$(((${EPOCHREALTIME//[!0-9]/} - start) / 100000))
  echo "demo.sh: $name exit $status, $((tenths / 10)).$((tenths % 10)) s"
  ((status == 0)) || exit "$status"
}

# What the machine offers tessera (`doctor` where this tessera has it, else `info`). Its --help
# lists the subcommands (`tessera doctor --help` prints the same help where there is no doctor).
checkup=info
grep -Eq '^ +doctor ' <<<"$("$tessera" --help)" && checkup=doctor
step "$checkup" "$tessera" "$checkup"
slides=() labels=()
for seed in 1 2 3 4; do
  step "synth slide$seed" "$tessera" synth "$work/slide$seed.tiff" --width 6144 --height 6144 --seed "$seed" --overwrite
  slides+=("$work/slide$seed.tiff")
  labels+=("$work/slide$seed.geojson")
done
rm -rf "$work/tiles.lmdb"
# Level 2 (4x downsampled) tiles of 32 px: a small task that trains in minutes on a CPU.
step tile "$tessera" tile "${slides[@]}" --out "$work/tiles.lmdb" --size 32 --level 2 --min-tissue 0.5 \
  --labels "${labels[@]}" --unannotated Normal --label-rule coverage --label-coverage 0.5
step train "$tessera" train --data "$work/tiles.lmdb" --model small-cnn --epochs 3 --batch 32 --optimizer adam \
  --lr 0.001 --val-fraction 0.25 --augment --checkpoint "$work/small-cnn.h5" --overwrite   # names the checkpoint at the end
