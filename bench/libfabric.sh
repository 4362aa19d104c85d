#!/usr/bin/env bash
# fi_pingpong (Debian's libfabric-bin, unmodified) over Portico's provider and, in the same run,
# over libfabric's own tcp;ofi_rxm and shm providers on this machine: one-way latency (half the
# round trip, fi_pingpong's usec/xfer) at 8 B and 4 KiB, bandwidth at 1 MiB. Each case runs
# RUNS times, interleaved across providers (this VM has fast and slow phases); the medians
# and Portico's ratio to each reference are printed, and every run's line is kept in
# target/libfabric-bench/ (RDM endpoints; Portico's two processes over net_memif).
# Then the same three sizes with an MPI ping-pong (fabric/tests/c/mpi_check.c pingpong) and
# with NetPIPE (NPopenmpi) under Open MPI's `mtl ofi` over Portico and tcp;ofi_rxm, and over
# Open MPI's own shared-memory transport (`pml ob1`, `btl vader`: Open MPI 4.1's `mtl ofi`
# does not start over libfabric's shm provider here) (MPI=0 skips them).
#
#   bench/libfabric.sh            # RUNS=5, ITERS=2000 (1 MiB: ITERS/10)
#   RUNS=3 ITERS=500 bench/libfabric.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
ITERS=${ITERS:-2000}
MODE=${MODE:-msg}   # msg or tagged (fi_pingpong -m)
out=target/libfabric-bench
mkdir -p "$out"
make -s provider >/dev/null
export FI_PROVIDER_PATH=$PWD/target/release/fabric
cores=$(python3 -c 'import os; c=sorted(os.sched_getaffinity(0)); print(c[0], c[-1])')
first=${cores% *}
last=${cores#* }
port=47800

wait_listen() {
    for _ in $(seq 200); do
        ss -ltnH "sport = :$1" | grep -q . && return 0
        sleep 0.05
    done
    echo "libfabric.sh: the fi_pingpong server never listened on $1" >&2
    return 1
}

# run PROVIDER SIZE ITERS -> prints fi_pingpong's result line (client side)
run() {
    local prov=$1 size=$2 iters=$3 sock=/tmp/portico-fi-bench-$$.sock
    port=$((port + 1))
    local args=(-p "$prov" -e rdm -m "$MODE" -S "$size" -I "$iters")
    rm -f "$sock"
    if [[ $prov == portico* ]]; then
        FI_PORTICO_DEV="net_memif0,role=server,id=0,socket=$sock" FI_PORTICO_IP=10.79.0.1 \
            FI_PORTICO_CORES=$last timeout 120 fi_pingpong "${args[@]}" -B $port >"$out/server.log" 2>&1 &
    else
        timeout 120 fi_pingpong "${args[@]}" -B $port >"$out/server.log" 2>&1 &
    fi
    local server=$!
    wait_listen $port
    local line
    if [[ $prov == portico* ]]; then
        line=$(FI_PORTICO_DEV="net_memif0,role=client,id=0,socket=$sock" FI_PORTICO_IP=10.79.0.2 \
            FI_PORTICO_CORES=$first timeout 120 fi_pingpong "${args[@]}" -P $port 127.0.0.1 2>&1 | tail -1)
    else
        line=$(timeout 120 fi_pingpong "${args[@]}" -P $port 127.0.0.1 2>&1 | tail -1)
    fi
    wait $server || true
    rm -f "$sock"
    echo "$line"
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

providers=(portico "tcp;ofi_rxm" shm)
cases=("8 lat" "4096 lat" "1048576 bw")
: >"$out/runs.txt"
for r in $(seq "$RUNS"); do
    for c in "${cases[@]}"; do
        set -- $c
        size=$1
        iters=$ITERS
        [[ $size == 1048576 ]] && iters=$((ITERS / 10))
        for p in "${providers[@]}"; do
            line=$(run "$p" "$size" "$iters")
            echo "$r $p $size $line" >>"$out/runs.txt"
        done
    done
done

printf '%-12s %-10s %12s %12s %12s   %s\n' case unit portico "tcp;ofi_rxm" shm "portico / tcp, / shm"
for c in "${cases[@]}"; do
    set -- $c
    size=$1 kind=$2
    declare -A med=()
    for p in "${providers[@]}"; do
        # fi_pingpong's columns: bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
        col=$([[ $kind == lat ]] && echo 10 || echo 9)
        med[$p]=$(awk -v p="$p" -v s="$size" -v c="$col" '$2 == p && $3 == s {print $c}' "$out/runs.txt" | median)
    done
    unit=$([[ $kind == lat ]] && echo "us one-way" || echo "MB/s")
    printf '%-12s %-10s %12s %12s %12s   %.2fx, %.2fx\n' "$size B" "$unit" "${med[portico]}" "${med[tcp;ofi_rxm]}" "${med[shm]}" \
        "$(echo "${med[portico]} / ${med[tcp;ofi_rxm]}" | bc -l)" "$(echo "${med[portico]} / ${med[shm]}" | bc -l)"
done
echo "runs: $RUNS per case, interleaved; every line in $out/runs.txt"

# ---- tagged: Portico's list-processing engine against ofi_rxm's software matching ---------
: >"$out/tagged.txt"
for r in $(seq "$RUNS"); do
    for c in "${cases[@]}"; do
        set -- $c
        size=$1
        iters=$ITERS
        [[ $size == 1048576 ]] && iters=$((ITERS / 10))
        echo "$r portico $size $(MODE=tagged run portico "$size" "$iters")" >>"$out/tagged.txt"
        echo "$r rxm $size $(MODE=tagged FI_PORTICO_LAYERING=1 run "portico;ofi_rxm" "$size" "$iters")" >>"$out/tagged.txt"
    done
done
echo
echo "tagged (fi_pingpong -m tagged), medians of $RUNS: matched by Portico's LPE vs by ofi_rxm over Portico"
printf '%-12s %-10s %12s %16s   %s\n' case unit "portico (LPE)" "portico;ofi_rxm" "rxm / LPE"
for c in "${cases[@]}"; do
    set -- $c
    size=$1 kind=$2
    col=$([[ $kind == lat ]] && echo 10 || echo 9)
    a=$(awk -v s="$size" -v c="$col" '$2 == "portico" && $3 == s {print $c}' "$out/tagged.txt" | median)
    b=$(awk -v s="$size" -v c="$col" '$2 == "rxm" && $3 == s {print $c}' "$out/tagged.txt" | median)
    unit=$([[ $kind == lat ]] && echo "us one-way" || echo "MB/s")
    printf '%-12s %-10s %12s %16s   %.2fx\n' "$size B" "$unit" "$a" "$b" "$(echo "$b / $a" | bc -l)"
done

# ---- Open MPI: an MPI ping-pong and NetPIPE over each provider ------------------------------
[[ ${MPI:-1} == 0 ]] && exit 0
# mpi PROVIDER PROGRAM [ARGS] -> the program's output, 2 ranks under Open MPI over PROVIDER
# (portico: one rank per memif side; vader: Open MPI's own shared memory, pml ob1)
mpi() {
    local prov=$1 sock=/tmp/portico-fi-np-$$.sock
    shift
    rm -f "$sock"
    local common=(--allow-run-as-root --oversubscribe --bind-to none --mca pml cm --mca mtl ofi
        --mca btl self --mca mtl_ofi_provider_include "$prov")
    if [[ $prov == vader ]]; then
        common=(--allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader)
    fi
    if [[ $prov == portico ]]; then
        timeout 120 mpirun "${common[@]}" \
            -np 1 -x FI_PROVIDER_PATH -x FI_PORTICO_DEV="net_memif0,role=server,id=0,socket=$sock" \
                -x FI_PORTICO_IP=10.79.1.1 -x FI_PORTICO_CORES=$last "$@" : \
            -np 1 -x FI_PROVIDER_PATH -x FI_PORTICO_DEV="net_memif0,role=client,id=0,socket=$sock" \
                -x FI_PORTICO_IP=10.79.1.2 -x FI_PORTICO_CORES=$first "$@" 2>&1 || true
    else
        timeout 120 mpirun "${common[@]}" -np 2 "$@" 2>&1 || true
    fi
    rm -f "$sock"
}
# npmpi PROVIDER SIZE REPS -> NetPIPE's line for SIZE
npmpi() {
    mpi "$1" NPopenmpi -l "$2" -u "$2" -n "$3" -p 0 -o "$out/np.out" |
        grep -E "^ *[0-9]+: +[0-9]+ bytes" | tail -1
}
mpicc -O2 -o "$out/mpi_check" fabric/tests/c/mpi_check.c
# mpipp PROVIDER SIZE ITERS -> mpi_check's ping-pong line
mpipp() {
    mpi "$1" "$out/mpi_check" pingpong "$2" "$3" | grep -E "^pingpong " | tail -1
}
providers=(portico "tcp;ofi_rxm" vader)
# mpi_table RUNNER FILE LAT_COL BW_COL BW_UNIT TITLE: RUNS interleaved runs of RUNNER (PROVIDER
# SIZE ITERS -> one line) over every case and provider into FILE, then the medians of column
# LAT_COL (latency cases) or BW_COL (bandwidth) with Portico's ratios
mpi_table() {
    local runner=$1 file=$2 lat_col=$3 bw_col=$4 bw_unit=$5 title=$6
    : >"$file"
    for r in $(seq "$RUNS"); do
        for c in "${cases[@]}"; do
            set -- $c
            local size=$1 iters=$ITERS
            [[ $size == 1048576 ]] && iters=$((ITERS / 10))
            for p in "${providers[@]}"; do
                echo "$r $p $size $($runner "$p" "$size" "$iters")" >>"$file"
            done
        done
    done
    echo
    echo "$title, medians of $RUNS:"
    printf '%-12s %-10s %12s %12s %12s   %s\n' case unit portico "tcp;ofi_rxm" "ob1+vader" "portico / tcp, / vader"
    for c in "${cases[@]}"; do
        set -- $c
        local size=$1 kind=$2
        local col=$([[ $kind == lat ]] && echo "$lat_col" || echo "$bw_col")
        local unit=$([[ $kind == lat ]] && echo "us one-way" || echo "$bw_unit")
        declare -A med=()
        for p in "${providers[@]}"; do
            med[$p]=$(awk -v p="$p" -v s="$size" -v c="$col" '$2 == p && $3 == s {print $c}' "$file" | median)
        done
        printf '%-12s %-10s %12s %12s %12s   %.2fx, %.2fx\n' "$size B" "$unit" "${med[portico]}" "${med[tcp;ofi_rxm]}" "${med[vader]}" \
            "$(echo "${med[portico]} / ${med[tcp;ofi_rxm]}" | bc -l)" "$(echo "${med[portico]} / ${med[vader]}" | bc -l)"
    done
    echo "every line in $file"
}
# mpi_check's line: pingpong SIZE bytes ITERS iters: USEC us one-way, MBPS MB/s
mpi_table mpipp "$out/mpipp.txt" 9 12 "MB/s" \
    "MPI ping-pong (fabric/tests/c/mpi_check.c pingpong; Open MPI, mtl ofi)"
# NetPIPE's line: N: SIZE bytes REPS times --> MBPS Mbps in USEC usec
mpi_table npmpi "$out/netpipe.txt" 13 10 "Mbit/s" "NetPIPE (Open MPI, mtl ofi)"
