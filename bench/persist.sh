#!/usr/bin/env bash
# portico bench persist: the five ways of making a remote write durable, in the same run, on
# the same machine, interleaved (run i of every mode, queue depth and size before run i+1 of
# any), so that a slow spell of this shared VM falls on all of them alike.
#
# Each run is `portico bench persist --mode M --qd Q --size S --duration DURATION --json`;
# the target's region is a file in a fresh directory under /var/tmp (removed afterwards). The
# table gives, per mode, queue depth and size, the median over runs of ops/s, p50 and p99
# latency (post to the completion that proves durability), the retransmissions summed over
# runs, and the runs' errors. Then the two targets, from the medians:
#
#   durable vs write-read, p50 latency at QD 1, 64 B:  ratio <= 0.6
#   durable vs write-read, ops/s at QD 32, 64 B:       ratio >= 1.8
#
# and, from the same runs, the frames and bytes both engines put on the wire per operation
# (the seed's network-load claim: a durable 64 B write against WRITE + READ). PMEM=emulated
# treats the region file as persistent memory (`--pmem emulated`: persist = cache-line
# write-back and a fence, as on DAX; not durable), the seed's setting on a machine without a
# DAX device.
#
# each with the per-run ratios beside it. Exit status 1 when a target is not met or a run
# failed; every figure is printed either way.
#
#   bench/persist.sh        RUNS=3 DURATION=3 SIZES="64 4096 65536" QDS="1 32"
#                           MODES="durable durable-region write-read write-flush write-send"
#                           EXTRA="--hugepages off --memory-mb 512" PMEM=file|emulated
#                           PORTICO_NO_BUILD=1
#
# The release build runs under `flock $LOCK` (one build at a time on a small machine). To keep
# builds off the machine while measuring, build first, then run the script under the same lock
# with PORTICO_NO_BUILD=1 (it would otherwise wait for the lock it is running under).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
DURATION=${DURATION:-3}
SIZES=${SIZES:-"64 4096 65536"}
QDS=${QDS:-"1 32"}
MODES=${MODES:-"durable durable-region write-read write-flush write-send"}
EXTRA=${EXTRA:-"--hugepages off --memory-mb 512"}
PMEM=${PMEM:-file}
PORTICO=${PORTICO:-target/release/portico}
OUT=${OUT:-bench/results/persist}
LOCK=${LOCK:-/tmp/portico-build.lock}

if [ -z "${PORTICO_NO_BUILD:-}" ]; then
    # The CLI's package: `cargo build` in engine/ builds the library only, and the runs below
    # would use whatever target/release/portico was built last.
    if command -v flock >/dev/null; then
        flock "$LOCK" cargo build --release -q -p portico-cli
    else
        cargo build --release -q -p portico-cli
    fi
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.err

failed=0
for i in $(seq 1 "$RUNS"); do
    for size in $SIZES; do
        for qd in $QDS; do
            for mode in $MODES; do
                base="$OUT/$mode-qd$qd-$size-$i"
                # shellcheck disable=SC2086
                if ! "$PORTICO" bench persist --mode "$mode" --qd "$qd" --size "$size" \
                    --pmem "$PMEM" --duration "$DURATION" --json $EXTRA >"$base.json" 2>"$base.err"; then
                    echo "run failed: $mode qd $qd size $size run $i (see $base.err)" >&2
                    failed=1
                fi
            done
        done
    done
done

python3 - "$OUT" "$RUNS" "$DURATION" "$failed" "$SIZES" "$QDS" "$MODES" <<'EOF'
import json, os, statistics, sys

out, runs, duration, failed = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
sizes, qds, modes = (a.split() for a in sys.argv[5:8])

def load(mode, qd, size, i):
    try:
        with open(os.path.join(out, f"{mode}-qd{qd}-{size}-{i}.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def counter(v, name):
    total = 0
    for w in v.get("workers", []):
        c = w["counters"]
        pairs = c.items() if isinstance(c, dict) else c
        total += sum(val for k, val in pairs if k == name)
    return total

cells = {}
for mode in modes:
    for qd in qds:
        for size in sizes:
            per_run = []
            for i in range(1, runs + 1):
                v = load(mode, qd, size, i)
                if v is None or not v["results"]:
                    per_run.append(None)
                    continue
                r = v["results"][0]
                per_run.append({
                    "ops": r["ops_per_sec"],
                    "p50": r["latency_ns"]["p50"] / 1000,
                    "p99": r["latency_ns"]["p99"] / 1000,
                    "retx": counter(v, "retransmissions"),
                    "errors": v["errors"],
                    "mapping": v["persist"]["mapping"],
                    "dax": v["persist"]["dax"],
                    "pkts": v["persist"]["wire_packets_per_op"],
                    "bytes": v["persist"]["wire_bytes_per_op"],
                })
            cells[(mode, qd, size)] = per_run

first = next((r for c in cells.values() for r in c if r), None)
if first:
    print(f"target region: {first['mapping']}, dax: {str(first['dax']).lower()}")
print(f"{runs} runs of {duration} s each; medians over runs; retransmissions summed over runs")
print(f"{'mode':<14} {'qd':>3} {'size':>6} {'ops/s':>10} {'p50 µs':>10} {'p99 µs':>10} {'retx':>6} {'errors':>6} {'runs ok':>8} {'frames/op':>10} {'bytes/op':>9}")

def med(mode, qd, size, key):
    vals = [r[key] for r in cells[(mode, qd, size)] if r and r[key] is not None]
    return statistics.median(vals) if vals else None

def fmt_bytes(b):
    return "-" if b is None else f"{b:.0f}"

for size in sizes:
    for qd in qds:
        for mode in modes:
            ok = [r for r in cells[(mode, qd, size)] if r]
            if not ok:
                print(f"{mode:<14} {qd:>3} {size:>6} {'(no result)':>10}")
                continue
            print(f"{mode:<14} {qd:>3} {size:>6} {med(mode, qd, size, 'ops'):>10.0f} "
                  f"{med(mode, qd, size, 'p50'):>10.1f} {med(mode, qd, size, 'p99'):>10.1f} "
                  f"{sum(r['retx'] for r in ok):>6} {sum(r['errors'] for r in ok):>6} "
                  f"{len(ok):>4}/{runs} {med(mode, qd, size, 'pkts'):>10.2f} "
                  f"{fmt_bytes(med(mode, qd, size, 'bytes')):>9}")

status = 1 if failed else 0

def target(label, key, qd, size, better, limit):
    global status
    d, w = med("durable", qd, size, key), med("write-read", qd, size, key)
    if d is None or w is None or w == 0:
        print(f"{label}: no figures (durable or write-read missing): NOT MET")
        status = 1
        return
    ratio = d / w
    runs_ratio = []
    for a, b in zip(cells[("durable", qd, size)], cells[("write-read", qd, size)]):
        runs_ratio.append(f"{a[key] / b[key]:.2f}" if a and b and b[key] else "-")
    met = ratio <= limit if better == "<=" else ratio >= limit
    status |= 0 if met else 1
    print(f"{label}: durable {d:.1f} / write-read {w:.1f} = {ratio:.3f} "
          f"(target {better} {limit}): {'met' if met else 'NOT MET'}; per run: {' '.join(runs_ratio)}")

print()
if "durable" in modes and "write-read" in modes and "64" in sizes:
    if "1" in qds:
        target("p50 latency ratio, QD 1, 64 B", "p50", "1", "64", "<=", 0.6)
    if "32" in qds:
        target("ops/s ratio, QD 32, 64 B", "ops", "32", "64", ">=", 1.8)
    for qd in qds:
        d, w = med("durable", qd, "64", "pkts"), med("write-read", qd, "64", "pkts")
        if d is not None and w is not None:
            db, wb = med("durable", qd, "64", "bytes"), med("write-read", qd, "64", "bytes")
            print(f"on the wire per 64 B durable write, QD {qd}: durable {d:.2f} frames "
                  f"({fmt_bytes(db)} B), write-read {w:.2f} frames ({fmt_bytes(wb)} B) "
                  f"(the seed: 2 against 4)")
sys.exit(status)
EOF
