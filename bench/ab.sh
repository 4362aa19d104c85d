#!/usr/bin/env bash
# Two builds of `portico` compared on one machine, runs interleaved (old, new, old, new, ...) so
# that the VM's fast and slow phases fall on both: the median ops/s and p50 of each, and the
# ratio new/old. Each run is `portico bench ARGS --csv FILE` (default: write --size 64 --qd 64
# --duration 3).
#
#   bench/ab.sh OLD_BINARY NEW_BINARY [ROUNDS] [-- BENCH ARGS...]
#   bench/ab.sh /tmp/portico.old target/release/portico 5 -- read --size 4096 --qd 16 --duration 3
set -euo pipefail
old=${1:?usage: bench/ab.sh OLD_BINARY NEW_BINARY [ROUNDS] [-- BENCH ARGS...]}
new=${2:?usage: bench/ab.sh OLD_BINARY NEW_BINARY [ROUNDS] [-- BENCH ARGS...]}
shift 2
rounds=5
if [[ $# -gt 0 && $1 != -- ]]; then
    rounds=$1
    shift
fi
[[ ${1:-} == -- ]] && shift
args=("$@")
((${#args[@]})) || args=(write --size 64 --qd 64 --duration 3)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run() { # binary label round
    "$1" bench "${args[@]}" --csv "$dir/$2-$3.csv" >"$dir/$2-$3.log" 2>&1 ||
        { echo "ab.sh: $2 run $3 failed:" >&2; tail -5 "$dir/$2-$3.log" >&2; exit 1; }
    # columns: op,size,qd,ops,seconds,ops_per_sec,gbit_per_sec,p50_ns,...
    awk -F, 'NR == 2 {printf "%.0f %s\n", $6, $8}' "$dir/$2-$3.csv"
}
echo "portico bench ${args[*]}: $rounds rounds, interleaved"
printf '%-6s %14s %10s %14s %10s\n' round old_ops/s old_p50 new_ops/s new_p50
for r in $(seq 1 "$rounds"); do
    read -r oo op <<<"$(run "$old" old "$r")"
    read -r no np <<<"$(run "$new" new "$r")"
    printf '%-6s %14s %10s %14s %10s\n' "$r" "$oo" "$op" "$no" "$np"
    echo "$oo $op $no $np" >>"$dir/all"
done
python3 - "$dir/all" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
med = [statistics.median(c) for c in zip(*rows)]
print(f"median  {med[0]:14.0f} {med[1]:10.0f} {med[2]:14.0f} {med[3]:10.0f}")
print(f"new/old ops/s {med[2] / med[0]:.3f}   p50 {med[3] / med[1]:.3f}")
PY
