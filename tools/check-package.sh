#!/usr/bin/env bash
# Checks the Debian package where nothing of tessera's is installed. It makes the package
# (`cmake --build build --target package`), then a fresh minimal Debian 12 (tools/debian-chroot.sh:
# debootstrap from the mirrors apt uses here, once, then unpacked from build/debian12-minbase.tar),
# in which `apt install ./tessera_*.deb` alone brings what tessera needs. There, with nothing else
# installed, it runs `tessera --version`, `tessera doctor` (where this tessera has one) and the
# demo's synth, tile and train (tools/demo.sh --installed), and fails unless each exits 0.
#
# Usage (root, in a configured build: tools/build.sh): bash tools/check-package.sh [--keep] [--skip-offline]
#   --keep           leaves the Debian tree (/var/tmp/tessera-package-root.*) for a look inside
#   --skip-offline   exits 0, saying so, when debootstrap cannot reach the mirror (tools/run-tests.sh)
# build/package-check/ gets debootstrap.log, apt.log, installed-packages.txt (each package apt
# installed, with its installed KiB), ldd.txt, commands.log and summary.json.
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0 skip_offline=0
for argument in "$@"; do
  case "$argument" in
    --keep) keep=1 ;;
    --skip-offline) skip_offline=1 ;;
    *) echo "check-package: unknown option '$argument' (--keep, --skip-offline)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "check-package: run it as root (debootstrap, chroot, mount)" >&2; exit 2; }
[[ -f build/CMakeCache.txt ]] || { echo "check-package: build/ is not configured (bash tools/build.sh)" >&2; exit 2; }
out=build/package-check
rm -rf "$out" && mkdir -p "$out" && out=$(realpath "$out")
started=$SECONDS
seconds_since() { echo $((SECONDS - $1)); }

echo "check-package: cmake --build build --target package"
phase=$SECONDS
cmake --build build --target package >"$out"/cpack.log 2>&1 ||
  { tail -20 "$out"/cpack.log >&2; echo "check-package: making the package failed (all of it in $out/cpack.log)" >&2; exit 1; }
package=$(sed -n 's/^CPack: - package: \(.*\.deb\) generated\.$/\1/p' "$out"/cpack.log | tail -1)
[[ -f $package ]] || { echo "check-package: cpack named no .deb (see $out/cpack.log)" >&2; exit 1; }
package_seconds=$(seconds_since "$phase")
deb_kb=$(($(stat -c %s "$package") / 1000))
echo "check-package: $(basename "$package"), $deb_kb kB, in $package_seconds s"
echo "  Depends: $(dpkg-deb -f "$package" Depends)"

source tools/debian-chroot.sh
root=$(mktemp -d /var/tmp/tessera-package-root.XXXXXX)
in_root() { chroot "$root" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root TMPDIR=/tmp LANG=C.UTF-8 "$@"; }
finish() {
  unmount_system_dirs
  if ((keep)); then echo "check-package: the Debian tree stays in $root"; else remove_root "$root"; fi
}
trap finish EXIT

echo "check-package: a fresh Debian 12 in $root"
phase=$SECONDS
fresh_debian12 "$root" "$out"/debootstrap.log || {
  status=$?
  if ((status == 3 && skip_offline)); then
    echo "check-package: SKIPPED: no Debian mirror reachable, so no Debian 12 to install the package into"
    exit 0
  fi
  exit 1
}
root_seconds=$(seconds_since "$phase")
installed_before=$(in_root dpkg-query -W -f '${Package}\n')
mount_system_dirs "$root"
mkdir -p "$root"/check
cp "$package" tools/demo.sh "$root"/check/

# The package and what apt brings with it, as a user installs it.
echo "check-package: apt install ./$(basename "$package")"
phase=$SECONDS
in_root sh -c "cd /check && DEBIAN_FRONTEND=noninteractive apt install -y ./$(basename "$package")" >"$out"/apt.log 2>&1 ||
  { tail -20 "$out"/apt.log >&2; echo "check-package: apt install failed (all of it in $out/apt.log)" >&2; exit 1; }
install_seconds=$(seconds_since "$phase")
in_root dpkg-query -W -f '${Package} ${Installed-Size}\n' |
  awk 'NR == FNR {before[$1] = 1; next} !($1 in before)' <(echo "$installed_before") - | sort >"$out"/installed-packages.txt
package_count=$(wc -l <"$out"/installed-packages.txt)
installed_mib=$(awk '{kib += $2} END {printf "%d", kib / 1024}' "$out"/installed-packages.txt)
download=$(grep -o 'Need to get [^ ]* [kMG]B' "$out"/apt.log | head -1 | cut -d' ' -f4-)
echo "check-package: apt installed $package_count packages ($download downloaded, $installed_mib MiB installed)" \
     "in $install_seconds s; the list in $out/installed-packages.txt"

# Every library tessera loads comes from a package apt installed.
in_root ldd /usr/bin/tessera >"$out"/ldd.txt
if grep -q 'not found' "$out"/ldd.txt; then
  grep 'not found' "$out"/ldd.txt >&2
  echo "check-package: libraries that no installed package provides" >&2
  exit 1
fi
echo "check-package: tessera loads $(grep -c '=> /' "$out"/ldd.txt) libraries, all found"

# The commands, as a user runs them after the install, in a folder of their own; demo.sh prints
# "demo.sh: NAME exit STATUS, SECONDS s" after each and stops at the first that fails.
echo "check-package: tessera --version, then tools/demo.sh --installed (doctor or info, synth, tile, train)"
phase=$SECONDS
status=0
in_root sh -c 'mkdir -p /root/demo && cd /root/demo && tessera --version && echo "demo.sh: --version exit 0, 0.0 s" &&
               bash /check/demo.sh --installed' 2>&1 | tee "$out"/commands.log || status=$?
demo_seconds=$(seconds_since "$phase")
for name in --version synth tile train; do
  grep -Eq "^demo.sh: $name( [^ ]+)? exit 0, " "$out"/commands.log ||
    { echo "check-package: '$name' did not run to exit 0 (see $out/commands.log)" >&2; status=1; }
done
if grep -Eq '^ +doctor ' <<<"$(in_root tessera --help)" && ! grep -q '^demo.sh: doctor exit 0, ' "$out"/commands.log; then
  echo "check-package: 'doctor' did not run to exit 0 (see $out/commands.log)" >&2
  status=1
fi

# The record: the package, what apt installed, each command's exit status and seconds.
steps=$(sed -n 's/^demo.sh: \(.*\) exit \([0-9]*\), \([0-9.]*\) s$/{"command": "\1", "exit": \2, "seconds": \3}/p' \
          "$out"/commands.log | paste -sd, | sed 's/},{/}, {/g')
cat >"$out"/summary.json <<EOF
{"date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "package": "$(basename "$package")", "package_kb": $deb_kb,
 "depends": "$(dpkg-deb -f "$package" Depends)",
 "apt_packages_installed": $package_count, "apt_download": "$download", "apt_installed_mib": $installed_mib,
 "seconds": {"package": $package_seconds, "debian12_root": $root_seconds, "apt_install": $install_seconds,
             "commands": $demo_seconds, "total": $(seconds_since "$started")},
 "commands": [$steps], "exit": $status}
EOF
echo "check-package: $( ((status == 0)) && echo passed || echo FAILED) in $(seconds_since "$started") s" \
     "(package $package_seconds s, Debian 12 root $root_seconds s, apt install $install_seconds s," \
     "commands $demo_seconds s); summary in $out/summary.json"
exit "$status"
