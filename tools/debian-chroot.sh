# shellcheck shell=bash
# Sourced (as root) by the checks that run tessera where nothing of it is installed
# (bench/gpu/check-bundle.sh, tools/check-package.sh): a minimal Debian 12 made by
# `debootstrap --variant=minbase bookworm`, with the suites this machine's apt uses (bookworm,
# -updates, -security, as Debian's installer writes them), from the same mirrors.
#
#   fresh_debian12 ROOT LOG     makes ROOT a fresh minimal Debian 12 with current package lists.
#                               debootstrap runs once into $debian12_base (its log in LOG); every
#                               later ROOT is a copy of that tree, which is never entered.
#   mount_system_dirs ROOT      binds /proc, /sys and /dev into ROOT
#   unmount_system_dirs         undoes every mount_system_dirs (call it from the script's EXIT trap)
#   remove_root ROOT            deletes ROOT, refusing while anything is mounted inside it

debian12_base=/var/tmp/tessera-debian12-minbase
debian_chroot_mounts=()

# "deb URL SUITE main" for each bookworm suite apt uses here; Debian's own mirror if none.
debian12_sources() {
  local sources
  sources=$(apt-cache policy | awk '$2 ~ /^https?:/ && $3 ~ /^bookworm(-updates|-security)?\/main$/ {
                                      sub("/main", "", $3); print "deb", $2, $3, "main"}' | sort -u)
  echo "${sources:-deb http://deb.debian.org/debian bookworm main}"
}

fresh_debian12() {
  local root=$1 log=$2 sources mirror
  sources=$(debian12_sources)
  if [[ ! -e $debian12_base/.complete ]]; then
    command -v debootstrap >/dev/null || { echo "debian-chroot: debootstrap is missing (apt-get install debootstrap)" >&2; return 2; }
    remove_root "$debian12_base"
    mirror=$(awk '$3 == "bookworm" {print $2; exit}' <<<"$sources")
    debootstrap --variant=minbase bookworm "$debian12_base" "${mirror:-http://deb.debian.org/debian}" >"$log"
    echo "$sources" >"$debian12_base"/etc/apt/sources.list
    touch "$debian12_base"/.complete
  fi
  remove_root "$root"
  cp -a "$debian12_base" "$root"
  rm "$root"/.complete
  cp /etc/resolv.conf "$root"/etc/resolv.conf
  chroot "$root" apt-get update -qq
}

mount_system_dirs() {
  local root=$1 fs
  for fs in proc sys dev; do
    mount --bind "/$fs" "$root/$fs"
    debian_chroot_mounts+=("$root/$fs")
  done
}

unmount_system_dirs() {
  local i
  for ((i = ${#debian_chroot_mounts[@]} - 1; i >= 0; i--)); do umount "${debian_chroot_mounts[i]}"; done
  debian_chroot_mounts=()
}

remove_root() {
  local root=$1
  [[ -e $root ]] || return 0
  if grep -q " $(realpath "$root")/" /proc/mounts; then
    echo "debian-chroot: $root has file systems mounted inside it; not deleting it" >&2
    return 1
  fi
  rm -rf --one-file-system "$root"
}
