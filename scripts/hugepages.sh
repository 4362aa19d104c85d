#!/usr/bin/env bash
# Reserves 2 MiB hugepages and mounts hugetlbfs when possible, so DPDK runs on hugepages.
# Where that is not possible (no root, a container without /sys write access), it says so and
# exits 0: Portico then runs with --no-huge and says so in its banner.
#   scripts/hugepages.sh [PAGES]     default 512 pages (1 GiB)
set -uo pipefail

want=${1:-512}
sysfs=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
mnt=/dev/hugepages

fallback() {
    echo "hugepages: $1; Portico will use --no-huge"
    exit 0
}

if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    fallback "not root and no password-less sudo"
fi

[ -e "$sysfs" ] || fallback "this kernel offers no 2 MiB hugepages ($sysfs missing)"

have=$(cat "$sysfs")
if [ "$have" -lt "$want" ]; then
    echo "$want" | "${sudo[@]}" tee "$sysfs" >/dev/null 2>&1 || fallback "cannot write $sysfs"
    have=$(cat "$sysfs")
fi
[ "$have" -gt 0 ] || fallback "the kernel reserved no pages (memory too fragmented?)"

if ! grep -qs " hugetlbfs " /proc/mounts; then
    "${sudo[@]}" mkdir -p "$mnt" && "${sudo[@]}" mount -t hugetlbfs nodev "$mnt" 2>/dev/null \
        || fallback "cannot mount hugetlbfs on $mnt"
fi

free=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
echo "hugepages: $have pages of 2 MiB reserved, $free free, hugetlbfs mounted"
