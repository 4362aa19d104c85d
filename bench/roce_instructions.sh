#!/usr/bin/env bash
# Instructions per operation of the pure RoCEv2 engine (no EAL), counted by callgrind: on a
# shared VM a wall-clock figure moves by a third from run to run, an instruction count does
# not. Each case runs twice (N1 and N2 operations after the same warm-up); the difference of
# the two totals over N2 - N1 is the cost of one operation, set-up excluded.
#
#   bench/roce_instructions.sh [CASES...]     default: write64 write64x32 write4096 emit64 parse64
#                                             (also: write65536 read64 emit64r lpe_match8 lpe_match1000 lpe_repost1000
#                                              tagged8 tagged8x32)
#   BIN=path/to/roce_count bench/roce_instructions.sh   (a binary built elsewhere, for A/B)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "no valgrind: apt-get install valgrind" >&2; exit 1; }
if [ -z "${BIN:-}" ]; then
    BIN=$(cargo bench -p portico-bench --bench roce_count --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "roce_count" and m.get("executable"):
        print(m["executable"])')
fi
CASES=${*:-write64 write64x32 write4096 emit64 parse64}
N1=${N1:-2000}
N2=${N2:-12000}
total() {
    local out
    out=$(mktemp)
    valgrind --tool=callgrind --callgrind-out-file="$out" "$BIN" "$1" "$2" >/dev/null 2>&1
    awk '/^summary:/ {print $2}' "$out"
    rm -f "$out"
}
printf '%-12s %14s\n' case instr/op
for c in $CASES; do
    a=$(total "$c" "$N1")
    b=$(total "$c" "$N2")
    awk -v c="$c" -v a="$a" -v b="$b" -v n1="$N1" -v n2="$N2" \
        'BEGIN {printf "%-12s %14.1f\n", c, (b - a) / (n2 - n1)}'
done
