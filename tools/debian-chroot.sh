# shellcheck shell=bash
# Sourced (as root) by the checks that run tessera where nothing of it is installed
# (bench/gpu/check-bundle.sh, tools/check-package.sh): a minimal Debian 12 made by
# `debootstrap --variant=minbase bookworm`, with the suites this machine's apt uses (bookworm,
# -updates, -security, as Debian's installer writes them), from the same mirrors.
#
#   fresh_debian12 ROOT LOG     makes ROOT a fresh minimal Debian 12 with current package lists.
#                               debootstrap runs once (its log in LOG) into a tarball,
#                               $debian12_base_tarball (build/debian12-minbase.tar); every ROOT
#                               after is unpacked from it. Delete the tarball to debootstrap again.
#                               Returns 3 when the mirror does not answer (no debootstrap, no
#                               package lists).
#   mount_system_dirs ROOT      binds /proc, /sys and /dev into ROOT
#   unmount_system_dirs         undoes every mount_system_dirs (call it from the script's EXIT trap)
#   remove_root ROOT            deletes ROOT, refusing while anything is mounted inside it

debian12_base_tarball=${TESSERA_DEBIAN12_TARBALL:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/debian12-minbase.tar}
debian_chroot_mounts=()

# "deb URL SUITE main" for each bookworm suite apt uses here; Debian's own mirror if none.
debian12_sources() {
  local sources
  sources=$(apt-cache policy | awk '$2 ~ /^https?:/ && $3 ~ /^bookworm(-updates|-security)?\/main$/ {
                                      sub("/main", "", $3); print "deb", $2, $3, "main"}' | sort -u)
  echo "${sources:-deb http://deb.debian.org/debian bookworm main}"
}

# Whether bookworm's Release file comes from the mirror, fetched as debootstrap fetches (wget).
debian12_mirror_reachable() {
  local mirror
  mirror=$(debian12_sources | awk '$3 == "bookworm" {print $2; exit}')
  wget -q --timeout=20 --tries=2 -O /dev/null "$mirror/dists/bookworm/Release" && return 0
  echo "debian-chroot: the Debian mirror $mirror (the one apt uses here) does not answer" >&2
  return 3
}

# The tarball of a minimal Debian 12, made by debootstrap when there is none.
debian12_base() {
  local log=$1 mirror staging
  [[ -s $debian12_base_tarball ]] && return 0
  command -v debootstrap >/dev/null || { echo "debian-chroot: debootstrap is missing (apt-get install debootstrap)" >&2; return 2; }
  mirror=$(debian12_sources | awk '$3 == "bookworm" {print $2; exit}')
  mkdir -p "$(dirname "$debian12_base_tarball")" && staging=$(mktemp -d /var/tmp/tessera-debootstrap.XXXXXX) || return
  if ! debootstrap --variant=minbase bookworm "$staging" "$mirror" >"$log" 2>&1; then
    tail -5 "$log" >&2
    echo "debian-chroot: debootstrap failed (all of it in $log)" >&2
    rm -rf --one-file-system "$staging"
    return 1
  fi
  # Refetched by every root (lists/partial stays: apt's download user owns it).
  find "$staging"/var/cache/apt/archives "$staging"/var/lib/apt/lists -maxdepth 1 -type f -delete
  chmod 755 "$staging" &&  # mktemp's 0700 would keep apt's download user out of the root
    tar --numeric-owner -C "$staging" -cf "$debian12_base_tarball.partial" . &&
    mv "$debian12_base_tarball.partial" "$debian12_base_tarball"
  local status=$?
  rm -rf --one-file-system "$staging"
  return $status
}

fresh_debian12() {
  local root=$1 log=$2
  # Chained: a caller's `||` turns off set -e in here.
  debian12_mirror_reachable && debian12_base "$log" && remove_root "$root" && mkdir -p "$root" &&
    tar --numeric-owner -C "$root" -xpf "$debian12_base_tarball" && chmod 755 "$root" &&
    debian12_sources >"$root"/etc/apt/sources.list &&
    cp /etc/resolv.conf "$root"/etc/resolv.conf &&
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
