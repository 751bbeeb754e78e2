#!/usr/bin/env bash
# Builds the GPU bundle: tessera, its test and bench executables, the shared libraries they load,
# Debian's Vulkan loader and Khronos validation layer (packages unpacked), the tests' and tools'
# Python files and ../shared/testdata, as one tar.xz in .gpu-bundle/ (ignored by git; at most
# 60 MiB, so that it travels within a 64 MiB working tree). The executables find the bundle's
# libraries through their RPATH ($ORIGIN/../../../lib); glibc, libstdc++ and libgcc_s are the
# target machine's (newer ones run these binaries; a driver loaded beside them needs them too).
# bench/gpu/run-on-gpu.sh unpacks and runs it. See bench/README.md.
#
# Usage: bash bench/gpu/make-bundle.sh [BUILD_DIR]   (default build; it is brought up to date)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
out=.gpu-bundle
limit_mib=60
for tool in patchelf xz dpkg-deb apt-get; do
  command -v "$tool" >/dev/null || { echo "make-bundle: $tool is missing (bash tools/install-deps.sh)" >&2; exit 2; }
done
nice cmake --build "$build" --parallel 2 >/dev/null

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
bundle=$stage/tessera-bundle
tree=$bundle/tessera
mkdir -p "$tree"/build/{tools,tests,bench} "$tree"/build/Testing/Temporary "$bundle"/lib "$bundle"/vulkan/explicit_layer.d

# The programs (the test executables and the helpers the Python tests run: dump_loader,
# head_gradients), and the sources the tests read (Python tests, tools' scripts, test data).
cp "$build"/tools/tessera "$tree"/build/tools/
for program in "$build"/tests/* "$build"/bench/*; do
  if [[ -f $program && -x $program ]]; then cp "$program" "$tree/build/${program#"$build"/}"; fi
done
layer_dir=tests/support/discrete_gpu
mkdir -p "$tree/build/$layer_dir"
cp "$build/$layer_dir"/VkLayer_tessera_discrete_gpu.{so,json} "$tree/build/$layer_dir/"
cp "$build"/Testing/Temporary/CTestCostData.txt "$tree"/build/Testing/Temporary/ 2>/dev/null || true
mkdir -p "$tree"/{tests,tools,bench/gpu}
cp tests/*.py tests/*.cpp "$tree"/tests/
cp tools/*.py "$tree"/tools/
# The data files the tests and tools read beside the Python: the encoder presets
# (tools/vit_reference.py), and the version script test_doctor runs with cmake -P.
mkdir -p "$tree"/compute "$tree"/cmake
cp compute/*.json "$tree"/compute/
cp cmake/version.cmake "$tree"/cmake/
cp bench/*.py "$tree"/bench/
cp bench/gpu/*.sh bench/gpu/*.py "$tree"/bench/gpu/
[[ -d python ]] && cp -r python "$tree"/  # the Python tile-store reader, which its test imports
[[ -d ../shared/testdata ]] && mkdir -p "$bundle"/shared && cp -r ../shared/testdata "$bundle"/shared/

# Debian's Vulkan loader, the validation layer, and libglvnd's dispatcher (NVIDIA's Vulkan driver
# loads it), unpacked from their packages.
mkdir -p "$stage"/debs "$stage"/root
chmod 755 "$stage" && chmod 777 "$stage"/debs  # apt downloads as its own user
(cd "$stage"/debs && apt-get download -q libvulkan1 vulkan-validationlayers libglvnd0 >/dev/null)
for deb in "$stage"/debs/*.deb; do dpkg-deb -x "$deb" "$stage"/root; done
multiarch=$stage/root/usr/lib/x86_64-linux-gnu
cp -a "$multiarch"/libvulkan.so.1* "$multiarch"/libGLdispatch.so.0* "$multiarch"/libVkLayer_khronos_validation.so \
  "$bundle"/lib/
# DCMTK's data dictionary, which libdcmdata reads from the path built into it (Debian's
# /usr/share/libdcmtk*): without it no DICOM tag can be set or read. run-on-gpu.sh names it in
# DCMDICTPATH.
mkdir -p "$bundle"/dcmtk
cp /usr/share/libdcmtk*/dicom.dic /usr/share/libdcmtk*/private.dic "$bundle"/dcmtk/
sed 's|"library_path": *"[^"]*"|"library_path": "../../lib/libVkLayer_khronos_validation.so"|' \
  "$stage"/root/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json \
  >"$bundle"/vulkan/explicit_layer.d/VkLayer_khronos_validation.json

# Every shared library those load but the C and C++ runtimes, which the target machine provides.
runtime='^(ld-linux-x86-64|libc|libm|libmvec|libpthread|libdl|librt|libutil|libresolv|libanl|libstdc\+\+|libgcc_s)\.so'
elves() { find "$tree"/build "$bundle"/lib -type f -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print; }
elves | while read -r elf; do
  ldd "$elf" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $runtime || -e $bundle/lib/$name ]] || cp -L "$path" "$bundle/lib/$name"
done
missing=$(elves | xargs -n1 ldd 2>/dev/null | grep 'not found' | sort -u || true)
[[ -z $missing ]] || { echo "make-bundle: unresolved libraries: $missing" >&2; exit 1; }

# Smaller, and relocatable.
elves | xargs strip --strip-unneeded
find "$tree"/build/tools/tessera "$tree"/build/{tests,bench} -maxdepth 1 -type f -executable | while read -r program; do
  patchelf --force-rpath --set-rpath '$ORIGIN/../../../lib' "$program"
done
# A library's own RUNPATH (OpenMPI's names its plugin folder) would hide the executables' RPATH
# from its dependencies: each looks beside itself instead.
for library in "$bundle"/lib/*.so*; do
  [[ -L $library ]] || patchelf --force-rpath --set-rpath '$ORIGIN' "$library"
done

# Where the tests were built: the C++ tests name the source and build folders in full, and
# run-on-gpu.sh links those paths to the unpacked tree where they are free.
commit=$(git describe --always --dirty --abbrev=40)
cat >"$bundle"/manifest.json <<EOF
{"commit": "$commit", "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "source_dir": "$PWD",
 "build_dir": "$(cd "$build" && pwd)", "vulkan_packages": "$(ls "$stage"/debs | tr '\n' ' ')"}
EOF

mkdir -p "$out"
tar -C "$stage" -cf - tessera-bundle | xz -9 -T2 >"$out"/tessera-bundle.tar.xz.part
mv "$out"/tessera-bundle.tar.xz.part "$out"/tessera-bundle.tar.xz
size_mib=$(( $(stat -c %s "$out"/tessera-bundle.tar.xz) >> 20 ))
echo "make-bundle: $out/tessera-bundle.tar.xz, $size_mib MiB ($(du -sm "$bundle" | cut -f1) MiB unpacked), commit $commit"
if ((size_mib > limit_mib)); then
  echo "make-bundle: over $limit_mib MiB: it would not travel with the working tree" >&2
  exit 1
fi
