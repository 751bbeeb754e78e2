#!/usr/bin/env bash
# Checks the Debian package where nothing is installed: a fresh minimal Debian 12
# (tools/debian-chroot.sh: debootstrap, the mirrors apt uses here) in which `apt-get install
# ./tessera_*.deb` alone brings what tessera needs. Then, with nothing else installed, it runs
# `tessera doctor` (`tessera info` where this tessera has no doctor) and the demo's synth, tile and
# train (tools/demo.sh --installed), and prints what was installed and how each command ended.
# A manual check: it downloads and installs a few hundred packages and trains for minutes, so it
# is not part of CI. Its figures go into README.md ("Install from a Debian package").
#
# Usage (root): bash tools/check-package.sh [PACKAGE.deb] [OUT_DIR] [--keep]
#   defaults: the newest build/tessera_*.deb, and build/package-check. OUT_DIR gets apt.log,
#   installed-packages.txt (each package apt installed, with its installed KiB), ldd.txt,
#   commands.log and summary.json. The Debian tree, /var/tmp/tessera-package-root, is deleted at
#   the end unless --keep.
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0 arguments=()
for argument in "$@"; do
  [[ $argument == --keep ]] && keep=1 || arguments+=("$argument")
done
[[ $(id -u) == 0 ]] || { echo "check-package: run it as root (debootstrap, chroot, mount)" >&2; exit 2; }
package=${arguments[0]:-$(ls -t build/tessera_*.deb 2>/dev/null | head -1)}
[[ -f $package ]] || { echo "check-package: no package '${package}' (cmake --build build --target package)" >&2; exit 2; }
package=$(realpath "$package")
out=$(mkdir -p "${arguments[1]:-build/package-check}" && realpath "${arguments[1]:-build/package-check}")
root=/var/tmp/tessera-package-root
source tools/debian-chroot.sh
in_root() { chroot "$root" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root TMPDIR=/tmp LANG=C.UTF-8 "$@"; }
finish() {
  unmount_system_dirs
  ((keep)) || remove_root "$root"
}
trap finish EXIT

echo "check-package: a fresh Debian 12 in $root"
fresh_debian12 "$root" "$out"/debootstrap.log
installed_before=$(in_root dpkg-query -W -f '${Package}\n' | sort)
mount_system_dirs "$root"
mkdir -p "$root"/check
cp "$package" tools/demo.sh "$root"/check/

# The package and what apt brings with it (its Depends and Recommends), as a user installs it.
echo "check-package: apt-get install ./$(basename "$package")"
start=$SECONDS
in_root sh -c "cd /check && DEBIAN_FRONTEND=noninteractive apt-get install -y ./$(basename "$package")" >"$out"/apt.log 2>&1 ||
  { tail -20 "$out"/apt.log >&2; echo "check-package: apt-get install failed (all of it in $out/apt.log)" >&2; exit 1; }
install_seconds=$((SECONDS - start))
in_root dpkg-query -W -f '${Package} ${Installed-Size}\n' | sort >"$out"/all-packages.txt
join -v1 "$out"/all-packages.txt <(echo "$installed_before") >"$out"/installed-packages.txt
rm "$out"/all-packages.txt
package_count=$(wc -l <"$out"/installed-packages.txt)
installed_mb=$(awk '{kib += $2} END {printf "%d", kib / 1024}' "$out"/installed-packages.txt)
download=$(grep -o 'Need to get [^ ]* [kMG]B' "$out"/apt.log | head -1 | cut -d' ' -f4-)
deb_kb=$(($(stat -c %s "$package") / 1000))
deb_installed_kb=$(dpkg-deb -f "$package" Installed-Size)
depends=$(dpkg-deb -f "$package" Depends)
recommends=$(dpkg-deb -f "$package" Recommends)
echo "check-package: $(basename "$package"): $deb_kb kB, $deb_installed_kb KiB installed"
echo "check-package: apt installed $package_count packages (with tessera; $download downloaded," \
     "$installed_mb MiB installed) in $install_seconds s; the list in $out/installed-packages.txt"

# Every library tessera loads comes from a package apt installed.
in_root ldd /usr/bin/tessera >"$out"/ldd.txt
if grep -q 'not found' "$out"/ldd.txt; then
  grep 'not found' "$out"/ldd.txt >&2
  echo "check-package: libraries that no installed package provides" >&2
  exit 1
fi
echo "check-package: tessera loads $(grep -c '=> /' "$out"/ldd.txt) libraries, all found"

# The commands, as a user runs them after the install, in a folder of their own.
echo "check-package: tools/demo.sh --installed (tessera doctor or info, synth, tile, train)"
status=0
in_root sh -c 'mkdir -p /root/demo && cd /root/demo && bash /check/demo.sh --installed' 2>&1 |
  tee "$out"/commands.log || status=$?

# The record: what was installed, and each command's exit status and seconds (demo.sh's lines).
steps=$(sed -n 's/^demo.sh: \(.*\) exit \([0-9]*\), \([0-9.]*\) s$/{"command": "\1", "exit": \2, "seconds": \3}/p' \
          "$out"/commands.log | paste -sd, | sed 's/},{/}, {/g')
cat >"$out"/summary.json <<EOF
{"date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "package": "$(basename "$package")", "package_kb": $deb_kb,
 "package_installed_kib": $deb_installed_kb, "depends": "$depends", "recommends": "$recommends",
 "apt_packages_installed": $package_count, "apt_download": "$download", "apt_installed_mib": $installed_mb,
 "apt_seconds": $install_seconds, "commands": [$steps], "exit": $status}
EOF
echo "check-package: summary in $out/summary.json"
sed -n '/"commands"/,$p' "$out"/summary.json
exit "$status"
