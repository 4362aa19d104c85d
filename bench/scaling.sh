#!/usr/bin/env bash
# portico bench write over 1, 2, 4, 8 workers: how the rate scales with the cores.
#
# Each point is `portico bench write --size SIZE --qd QD --cores N --connections N
# --host-threads H --duration DURATION --json`: both engines in one process, N workers on N
# queues of each port, one queue pair per worker, QD operations outstanding over all of them,
# and H = N host threads (HOST_THREADS=1 for the single host loop), thread i driving worker i's
# queue pair from a core of its own where the machine has 2N cores. Runs are interleaved (run i of
# every N before run i+1 of any), so that a slow spell of a shared machine falls on all of them
# alike. The table gives, per N, the median ops/s and Gbit/s over the runs, the ratio to one
# worker (from the medians) and that ratio divided by N (1.00: linear), then each run's ops/s
# and p50 latency (one worker's 64 B rate is bimodal per process; the p50 tells the two modes
# apart: docs/benchmarking.md, "What the figures mean"), and the range of a cache line's round
# trip from the host's core to the workers' over the runs (`line ns`: where the cores sat).
#
# Only the worker counts the machine can hold are run: N workers need N cores besides the
# host's (on a 2-vCPU VM that is N = 1; N = 2 is run too, sharing cores, and marked so).
#
# With QD_PER_WORKER=1 the depth is QD per worker (N workers keep N x QD outstanding): the
# queue pairs stay as deep as the one worker's, so that the ratio measures the cores, not the
# shorter queues (with QD over all of them, 8 workers keep 15 each and batch less).
#
# With INLINE=1 each point runs `--inline` instead of host threads: every worker runs the
# application's loop for its own queue pair inside its own loop (no host thread, no ring
# between cores), so N workers need N cores.
#
#   bench/scaling.sh        RUNS=3 DURATION=2 SIZE=64 QD=120 WORKERS="1 2 4 8" HOST_THREADS=N
#                           INLINE=1 QD_PER_WORKER=1
#                           EXTRA="--hugepages off --memory-mb 512" PORTICO_NO_BUILD=1
#                           PORTICO="bash .devkit/env.sh portico"   (a packed build elsewhere)
#
# The release build runs under `flock $LOCK`; to keep builds off the machine while measuring,
# build first and run with PORTICO_NO_BUILD=1.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
DURATION=${DURATION:-2}
SIZE=${SIZE:-64}
QD=${QD:-120}
QD_PER_WORKER=${QD_PER_WORKER:-}
WORKERS=${WORKERS:-"1 2 4 8"}
EXTRA=${EXTRA:-"--hugepages off --memory-mb 512"}
PORTICO=${PORTICO:-target/release/portico}
OUT=${OUT:-bench/results/scaling}
HOST_THREADS=${HOST_THREADS:-N}
INLINE=${INLINE:-}
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

cores=$(nproc)
run=()
for n in $WORKERS; do
    # One core for the host; a single spare worker on a 2-core machine still shows the shape.
    # Inline, the workers are all there is.
    inline_fits=0
    [ -n "$INLINE" ] && ((n <= cores)) && inline_fits=1
    if ((n < cores || n == 1 || (n == 2 && cores == 2) || inline_fits)); then
        run+=("$n")
    else
        echo "scaling: skipping $n workers: $cores cores here" >&2
    fi
done
if ((${#run[@]} == 0)); then
    echo "scaling: no worker count fits $cores cores" >&2
    exit 2
fi

failed=0
for i in $(seq 1 "$RUNS"); do
    for n in "${run[@]}"; do
        f="$OUT/w$n-r$i"
        h=$HOST_THREADS
        [ "$h" = N ] && h=$n
        qd=$QD
        [ -n "$QD_PER_WORKER" ] && qd=$((QD * n))
        app=(--host-threads "$h")
        [ -n "$INLINE" ] && app=(--inline)
        # shellcheck disable=SC2086
        if ! $PORTICO bench write --size "$SIZE" --qd "$qd" --cores "$n" --connections "$n" \
            "${app[@]}" --duration "$DURATION" --json $EXTRA >"$f.json" 2>"$f.err"; then
            echo "scaling: $n workers, run $i failed: $(tail -1 "$f.err")" >&2
            failed=1
        fi
    done
done

python3 - "$OUT" "$RUNS" "$cores" "${run[@]}" <<'EOF'
import json, statistics, sys
out, runs, cores, ns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [int(n) for n in sys.argv[4:]]
rows = {}
for n in ns:
    ops, gbit, p50, errors, hosts, qd, trips = [], [], [], 0, 0, "-", []
    for i in range(1, runs + 1):
        try:
            v = json.load(open(f"{out}/w{n}-r{i}.json"))
        except (OSError, ValueError):
            continue
        r = v["results"][0]
        ops.append(r["ops_per_sec"])
        gbit.append(r["gbit_per_sec"])
        p50.append(r["latency_ns"]["p50"] / 1000)
        errors += v.get("errors", 0)
        hosts = 0 if v.get("inline") else (len(v.get("host_threads", [])) or 1)
        qd = v.get("qd", "-")
        # A cache line's round trip from the host's core to each worker's, after the run
        # (docs/benchmarking.md): where the cores sat.
        trips += [t["round_trip_ns"] for t in v.get("cores", {}).get("line_trips", [])
                  if t.get("round_trip_ns") is not None]
    rows[n] = (ops, gbit, p50, errors, hosts, qd, trips)
base = statistics.median(rows[ns[0]][0]) if rows[ns[0]][0] else None
print(f"{'workers':>7} {'hosts':>5} {'qd':>5} {'ops/s':>12} {'Gbit/s':>8} {'ratio':>6} {'/N':>5} {'errors':>6} {'line ns':>9}  runs (ops/s, p50 µs)")
for n in ns:
    ops, gbit, p50, errors, hosts, qd, trips = rows[n]
    if not ops:
        print(f"{n:>7} {'failed':>12}")
        continue
    m = statistics.median(ops)
    ratio = m / base if base else float("nan")
    shared = "  (sharing cores)" if n + hosts > cores else ""
    line = f"{min(trips):.0f}-{max(trips):.0f}" if trips else "-"
    print(f"{n:>7} {hosts:>5} {qd:>5} {m:>12,.0f} {statistics.median(gbit):>8.2f} {ratio:>6.2f} {ratio / n:>5.2f} "
          f"{errors:>6} {line:>9}  {'  '.join(f'{x:,.0f} {l:.1f}' for x, l in zip(ops, p50))}{shared}")
EOF
exit "$failed"
