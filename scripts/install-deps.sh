#!/usr/bin/env bash
# Installs what Portico needs to build and test, from Debian's packages: DPDK 22.11 (headers,
# PMDs, dpdk-testpmd), clang/libclang for bindgen, pkg-config, g++ (libFuzzer, built by the fuzz
# targets), and for the tests iproute2 (network namespaces), python3-scapy (an independent
# RoCEv2 peer), tshark (captures of Portico's extensions must still decode as RoCEv2) and
# valgrind (memcheck of the engine's tests, scripts/valgrind.sh); libfabric's headers and tools
# (the provider in fabric/ is built against libfabric-dev and tested with fi_info and
# fi_pingpong from libfabric-bin), Open MPI and NetPIPE (MPI programs over the provider).
# Idempotent: does nothing when everything is there. Uses sudo when not run as root.
set -euo pipefail

packages=(libdpdk-dev dpdk dpdk-dev clang libclang-dev pkg-config make g++ iproute2 python3-scapy tshark valgrind
    libfabric-dev libfabric-bin openmpi-bin libopenmpi-dev netpipe-openmpi)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: cargo is not on PATH; install a Rust toolchain (rustup) first" >&2
    exit 1
fi

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all dependencies present (${packages[*]})"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
else
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
    exit 1
fi

echo "install-deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
pkg-config --modversion libdpdk >/dev/null || { echo "install-deps: libdpdk still not visible to pkg-config" >&2; exit 1; }
echo "install-deps: done (DPDK $(pkg-config --modversion libdpdk))"
