#!/usr/bin/env bash
# Runs the GPU bundle (bench/gpu/make-bundle.sh) on the machine it was carried to, within one
# deadline: unpacks it, prints `tessera info`, runs the benchmarks beside PyTorch (gpu_bench.py),
# then the test suite under the validation layer (run_suite.py) with the time left. Writes into
# OUT_DIR (at most 8 files): results.json (device, driver, benchmarks, ratios, suite summary),
# bench.json, suite.json, info.txt, run.log, suite-logs.tar.gz.
#
# Usage: bash bench/gpu/run-on-gpu.sh BUNDLE.tar.xz OUT_DIR [--minutes M] [--only bench|suite] [--quick]
#                                      [--tests REGEX]
#   --minutes  the whole run's budget (default 8.5: a run on the GPU machine is cut at 10, and
#              unpacking and the summary come on top of the deadline's margin)
#   --quick    small benchmark sizes (chosen anyway where tessera's device is a CPU: lavapipe)
#   --tests    a regular expression: the suite runs only the tests whose names it finds (a rerun)
# The Vulkan driver is the machine's: NVIDIA's manifest where it is installed, else the loader's
# default search (lavapipe, where the bundle is checked without a GPU; PyTorch then runs on the
# CPU, so that every step of this script runs before it meets a GPU).
set -euo pipefail
bundle_archive=$(realpath "$1")
out=$(mkdir -p "$2" && realpath "$2")
shift 2
minutes=8.5 only="" quick=() tests=""
while (($#)); do
  case $1 in
    --minutes) minutes=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --quick) quick=(--quick); shift ;;
    --tests) tests=$2; shift 2 ;;
    *) echo "run-on-gpu: unknown argument $1" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
deadline=$(python3 -c "print($start + $minutes * 60 - 20)")
exec > >(tee "$out"/run.log) 2>&1

work=${TMPDIR:-/tmp}/tessera-gpu-run
rm -rf "$work" && mkdir -p "$work"
if command -v xz >/dev/null; then
  tar -C "$work" -xJf "$bundle_archive"
else  # Python reads xz itself
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle_archive" "$work"
fi
bundle=$work/tessera-bundle
tree=$bundle/tessera
echo "bundle: $(cat "$bundle"/manifest.json)"

# The C++ tests name the build machine's source and build folders: link them here where free.
for key in source_dir build_dir; do
  path=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$bundle"/manifest.json "$key")
  target=$tree
  [[ $key == build_dir ]] && target=$tree/build
  if [[ ! -e $path ]]; then mkdir -p "$(dirname "$path")" && ln -s "$target" "$path"; fi
done

# The bundle's validation layer beside the machine's layers (VK_LAYER_PATH would hide the tests' own).
export VK_ADD_LAYER_PATH=$bundle/vulkan/explicit_layer.d${VK_ADD_LAYER_PATH:+:$VK_ADD_LAYER_PATH}
icd=$(find /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/nvidia/share/vulkan/icd.d /usr/local/share/vulkan/icd.d \
  -maxdepth 1 -name 'nvidia_icd*.json' 2>/dev/null | sort | head -1 || true)
if [[ -n $icd ]]; then
  export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd
  # The manifest names its library by file name, which the dynamic linker must find: where its
  # cache does not hold it (a driver mounted into a container), the driver's own lib folder.
  driver_library=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ICD']['library_path'])" "$icd")
  if [[ $driver_library != /* ]] && ! { /sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null; } | grep -qF "$driver_library"; then
    for dir in "$(dirname "$icd")"/../../../lib64 /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu; do
      if [[ -e $dir/$driver_library ]]; then
        export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(realpath "$dir")
        echo "Vulkan driver library: $dir/$driver_library (not in the linker's cache: LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
        break
      fi
    done
  fi
fi
echo "Vulkan driver manifest: ${VK_DRIVER_FILES:-none named, the loader searches}"
export XDG_CACHE_HOME=$work/cache
# DCMTK's data dictionary from the bundle (the machine may have no DCMTK of its own).
export DCMDICTPATH=$bundle/dcmtk/dicom.dic:$bundle/dcmtk/private.dic

missing=$(ldd "$tree"/build/tools/tessera | grep 'not found' || true)
[[ -z $missing ]] || { echo "run-on-gpu: tessera cannot load: $missing" >&2; exit 1; }
{
  if [[ -n $icd ]]; then echo "$icd: $(tr -d '\n ' <"$icd")"; fi
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
} | tee "$out"/info.txt
# Without a device every later step fails: stop at once with the loader's account of why, and
# keep the machine's time for a second run.
if ! "$tree"/build/tools/tessera info 2>&1 | tee -a "$out"/info.txt; then
  echo "run-on-gpu: tessera found no usable Vulkan device; the loader's account:" | tee -a "$out"/info.txt
  VK_LOADER_DEBUG=error,warn,driver "$tree"/build/tools/tessera info 2>&1 | tail -80 | tee -a "$out"/info.txt || true
  exit 1
fi

status=0
if [[ $only != suite ]]; then
  # The benchmarks take at most half of what is left when the suite follows.
  bench_deadline=$deadline
  [[ -z $only ]] && bench_deadline=$(python3 -c "import time; print(time.time() + ($deadline - time.time()) / 2)")
  python3 "$tree"/bench/gpu/gpu_bench.py --root "$tree" --out "$out"/bench.json --deadline "$bench_deadline" \
    "${quick[@]}" || status=1
fi
if [[ $only != bench ]]; then
  python3 "$tree"/bench/gpu/run_suite.py --root "$tree" --out "$out"/suite.json --logs "$work"/logs --tests "$tests" \
    --deadline "$deadline" || status=1
  tar -C "$work" -czf "$out"/suite-logs.tar.gz logs
fi

python3 - "$out" "$bundle" <<'EOF'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
bench, suite = load("bench.json"), load("suite.json")
bundle = json.load(open(os.path.join(sys.argv[2], "manifest.json")))  # its commit and build time
result = {"bundle": bundle, "info_text": open(os.path.join(out, "info.txt")).read()}
if bench:
    result.update({k: bench[k] for k in ("date", "info", "ratios") if k in bench})
    result["tessera"], result["pytorch"] = bench.get("tessera"), bench.get("pytorch")
if suite:
    result["suite"] = {"counts": suite["counts"], "seconds": suite["seconds"],
                       "not_passed": {t["name"]: t.get("reason", t["status"]) for t in suite["tests"]
                                      if t["status"] != "passed"},
                       "passed_with_skipped_cases": {t["name"]: t["skipped_cases"] for t in suite["tests"]
                                                     if t.get("skipped_cases")}}
json.dump(result, open(os.path.join(out, "results.json"), "w"), indent=1)
print(json.dumps(result.get("ratios", {})), json.dumps(result.get("suite", {}).get("counts", {})))
EOF
echo "run-on-gpu: $(( $(date +%s) - start )) s, status $status"
exit $status
