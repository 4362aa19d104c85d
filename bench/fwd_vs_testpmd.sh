#!/usr/bin/env bash
# portico fwd vs dpdk-testpmd io forwarding, in the same run, on the same two net_null ports,
# the same cores (main lcore 0, forwarding on core 1), burst size, descriptors and duration.
# Each tool runs RUNS times per memory mode (without and with hugepages, alternating the
# tools); a run's rate is the median of its per-second forwarding rates after the first
# second; the figure reported is the median over runs, and the best run beside it (this kind of
# machine is a shared VM: neighbours only ever take speed away, so the best run is the closest
# to what the code can do). Prints Mpps for both and the ratios.
#
#   bench/fwd_vs_testpmd.sh            RUNS=5 DURATION=5 BURST=32 MODES="nohuge huge"
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
DURATION=${DURATION:-5}
BURST=${BURST:-32}
DESC=${DESC:-1024}
MAIN_CORE=${MAIN_CORE:-0}
FWD_CORE=${FWD_CORE:-1}
MODES=${MODES:-"nohuge huge"}
PORTICO=${PORTICO:-target/release/portico}
TESTPMD=${TESTPMD:-dpdk-testpmd}
OUT=${OUT:-bench/results}

command -v "$TESTPMD" >/dev/null || { echo "no $TESTPMD: run scripts/install-deps.sh" >&2; exit 1; }
[ -n "${PORTICO_NO_BUILD:-}" ] || cargo build --release -q
mkdir -p "$OUT"

median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) {print 0} else if (NR%2) {print v[(NR+1)/2]} else {print (v[NR/2]+v[NR/2+1])/2}}'; }

# Forwarded packets per second, summed over both ports, one value per stats period.
testpmd_rates() {
    awk '/Tx-pps:/ {sum += $2; n++; if (n % 2 == 0) {print sum; sum = 0}}' "$1"
}
portico_rates() {
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try: v = json.loads(line)
    except ValueError: continue
    if v.get("type") == "interval":
        print(sum(w["tx_pps"] for w in v["workers"]))' "$1"
}
steady() { tail -n +2 | median; }   # drop the first period (start-up), median of the rest

run_testpmd() { # mode log
    local mem=(--in-memory)
    [ "$1" = nohuge ] && mem=(--no-huge -m 1024 --no-shconf)
    timeout -s INT $((DURATION + 3)) "$TESTPMD" -l "$MAIN_CORE,$FWD_CORE" --main-lcore "$MAIN_CORE" \
        "${mem[@]}" --no-pci --log-level=lib.eal:error \
        --vdev net_null0,size=64 --vdev net_null1,size=64 -- \
        --forward-mode=io --nb-cores=1 --burst="$BURST" --rxd="$DESC" --txd="$DESC" \
        --stats-period 1 </dev/null >"$2" 2>&1 || true
}

run_portico() { # mode log
    local mem=(--hugepages on)
    [ "$1" = nohuge ] && mem=(--hugepages off --memory-mb 1024)
    "$PORTICO" fwd --mode io --cores "$FWD_CORE" --burst "$BURST" --rxd "$DESC" --txd "$DESC" \
        --duration "$DURATION" --stats-period 1 --json "${mem[@]}" -- \
        -l "$MAIN_CORE" --vdev net_null0,size=64 --vdev net_null1,size=64 >"$2" 2>/dev/null
}

printf "%-8s %5s %14s %14s %8s   %s\n" memory runs "testpmd Mpps" "portico Mpps" ratio "(best runs: testpmd, portico, ratio)"
for mode in $MODES; do
    if [ "$mode" = huge ]; then
        scripts/hugepages.sh >/dev/null
        if ! awk '/HugePages_Free/ {exit !($2 > 0)}' /proc/meminfo; then
            echo "huge: no free hugepages here, skipped"
            continue
        fi
    fi
    t_runs=(); p_runs=()
    for i in $(seq 1 "$RUNS"); do
        run_testpmd "$mode" "$OUT/testpmd-$mode-$i.log"
        t_runs+=("$(testpmd_rates "$OUT/testpmd-$mode-$i.log" | steady)")
        run_portico "$mode" "$OUT/portico-$mode-$i.jsonl"
        p_runs+=("$(portico_rates "$OUT/portico-$mode-$i.jsonl" | steady)")
    done
    t=$(printf "%s\n" "${t_runs[@]}" | median)
    p=$(printf "%s\n" "${p_runs[@]}" | median)
    tb=$(printf "%s\n" "${t_runs[@]}" | sort -g | tail -1)
    pb=$(printf "%s\n" "${p_runs[@]}" | sort -g | tail -1)
    awk -v m="$mode" -v r="$RUNS" -v t="$t" -v p="$p" -v tb="$tb" -v pb="$pb" -v tr="${t_runs[*]}" -v pr="${p_runs[*]}" 'BEGIN {
        printf "%-8s %5d %14.2f %14.2f %8.3f   (%.2f, %.2f, %.3f)\n", m, r, t / 1e6, p / 1e6, (t > 0 ? p / t : 0), tb / 1e6, pb / 1e6, (tb > 0 ? pb / tb : 0)
        n = split(tr, a, " "); s = ""; for (i = 1; i <= n; i++) s = s sprintf(" %.2f", a[i] / 1e6)
        printf "           testpmd runs (Mpps):%s\n", s
        n = split(pr, b, " "); s = ""; for (i = 1; i <= n; i++) s = s sprintf(" %.2f", b[i] / 1e6)
        printf "           portico runs (Mpps):%s\n", s
    }'
done
