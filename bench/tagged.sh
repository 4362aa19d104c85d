#!/usr/bin/env bash
# portico bench tagged: tagged messaging (eager, unexpected, rendezvous) against software
# matching and RDMA READ, RUNS times, with the medians of the key figures and the three
# targets:
#
#   eager 8 B msg/s, depth 1000 / depth 1 (window 1 both):              ratio >= 0.8
#   eager 8 B msg/s at depth 1000 / software baseline at depth 1000:    ratio >= 10
#   rendezvous 4 MiB Gbit/s / RDMA READ 4 MiB Gbit/s:                   ratio >= 0.9
#
# each from the medians over runs, with the per-run ratios beside it (and, for reference, the
# depth ratio with depth 1000's own window, which compares windows as much as depths). Each
# run is `portico bench tagged --duration DURATION --json $EXTRA` (DURATION: seconds measured
# per point). Exit status 1 when a target is not met or a run failed; every figure is printed
# either way.
#
#   bench/tagged.sh        RUNS=3 DURATION=0.4 EXTRA="--hugepages off --memory-mb 512"
#                          PORTICO_NO_BUILD=1
#
# The release build and every run take `flock $LOCK` (one build or measurement at a time on a
# small machine: a build or a test beside a run takes the cores the engines need). When the
# caller already holds the lock, set PORTICO_NO_BUILD=1: the script then neither builds nor
# takes the lock (it would wait for the lock it runs under).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
DURATION=${DURATION:-0.4}
EXTRA=${EXTRA:-"--hugepages off --memory-mb 512"}
PORTICO=${PORTICO:-target/release/portico}
OUT=${OUT:-bench/results/tagged}
LOCK=${LOCK:-/tmp/portico-build.lock}

locked() {
    if [ -z "${PORTICO_NO_BUILD:-}" ] && command -v flock >/dev/null; then
        flock "$LOCK" "$@"
    else
        "$@"
    fi
}

if [ -z "${PORTICO_NO_BUILD:-}" ]; then
    # The CLI's package: `cargo build` in engine/ builds the library only, and the runs below
    # would use whatever target/release/portico was built last.
    locked cargo build --release -q -p portico-cli
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.err

failed=0
for i in $(seq 1 "$RUNS"); do
    # shellcheck disable=SC2086
    if ! locked $PORTICO bench tagged --duration "$DURATION" --json $EXTRA \
        >"$OUT/run-$i.json" 2>"$OUT/run-$i.err"; then
        echo "run $i failed (see $OUT/run-$i.err)" >&2
        failed=1
    fi
done

python3 - "$OUT" "$RUNS" "$DURATION" "$failed" <<'EOF'
import json, os, statistics, sys

out, runs, duration, failed = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])

loaded = []
for i in range(1, runs + 1):
    try:
        with open(os.path.join(out, f"run-{i}.json")) as f:
            loaded.append(json.load(f))
    except (OSError, ValueError):
        loaded.append(None)
ok = [v for v in loaded if v]
if not ok:
    print("no run produced a summary")
    sys.exit(1)

def points(v):
    return {r["name"]: r for r in v["results"]}

by_run = [points(v) for v in ok]
names = list(by_run[0])

def med(name, key="ops_per_sec"):
    vals = [p[name][key] for p in by_run if name in p and p[name]["ops"] > 0]
    return statistics.median(vals) if vals else None

def fmt(x, spec=".0f"):
    return "-" if x is None else format(x, spec)

first = ok[0]
t = first["tagged"]
retx = sum(c[1] for v in ok for w in v["workers"] for c in w["counters"] if c[0] == "retransmissions")
print(f"{len(ok)}/{runs} runs of `bench tagged --duration {duration}` ({t['point_seconds']} s per point "
      f"after {t['warmup_seconds']} s warm-up), MTU {t['mtu']}, window {first['qd']}; "
      f"medians over runs; {retx} retransmissions, {sum(v['errors'] for v in ok)} errors over all runs")
secs = " ".join("%.1f" % v["seconds"] for v in ok)
print(f"run seconds: {secs}")

print()
print("eager tagged vs software baseline, msg/s")
print(f"{'size':>5} {'depth':>5} {'wild':>5} {'win':>4} {'tagged':>11} {'p50 µs':>8} {'baseline':>11} {'p50 µs':>8} {'tag/base':>8}")
for n in names:
    r = by_run[0][n]
    if r["part"] != "eager":
        continue
    base = n.replace("eager-", "baseline-", 1)
    tg, bs = med(n), med(base)
    p50 = lambda x: None if med(x) is None else statistics.median(
        p[x]["latency_ns"]["p50"] / 1000 for p in by_run if x in p)
    ratio = tg / bs if tg and bs else None
    print(f"{r['size']:>5} {r['depth']:>5} {'10%' if r['wildcards'] else '-':>5} {r['window']:>4} "
          f"{fmt(tg):>11} {fmt(p50(n), '.1f'):>8} {fmt(bs):>11} {fmt(p50(base), '.1f'):>8} {fmt(ratio, '.2f'):>8}")

print()
print("unexpected (message first, receive posted on put-overflow), msg/s")
for n in names:
    r = by_run[0][n]
    if r["part"] == "unexpected":
        print(f"{r['size']:>5} B window {r['window']:>3}: {fmt(med(n)):>10}")

print()
print("rendezvous vs RDMA READ, Gbit/s")
for n in names:
    r = by_run[0][n]
    if r["part"] != "rndv":
        continue
    rd = n.replace("rndv-", "read-", 1)
    a, b = med(n, "gbit_per_sec"), med(rd, "gbit_per_sec")
    print(f"{r['size']:>8} B window {r['window']:>2}: rndv {fmt(a, '.2f'):>7}  READ {fmt(b, '.2f'):>7}  "
          f"ratio {fmt(a / b if a and b else None, '.3f')}")

status = 1 if failed else 0

def target(label, num, den, limit, gbit=False):
    global status
    k = "gbit_per_sec" if gbit else "ops_per_sec"
    n, d = med(num, k), med(den, k)
    per_run = []
    for p in by_run:
        a, b = p.get(num), p.get(den)
        per_run.append(f"{a[k] / b[k]:.2f}" if a and b and b[k] else "-")
    if n is None or d is None or d == 0:
        print(f"{label}: no figures ({num} or {den} missing): NOT met")
        if limit is not None:
            status = 1
        return
    ratio = n / d
    if limit is None:
        print(f"{label}: {n:.0f} / {d:.0f} = {ratio:.3f} (for reference); per run: {' '.join(per_run)}")
        return
    met = ratio >= limit
    status |= 0 if met else 1
    unit, spec = ("Gbit/s", ".2f") if gbit else ("msg/s", ".0f")
    print(f"{label}: {n:{spec}} / {d:{spec}} {unit} = {ratio:.3f} (target >= {limit}): "
          f"{'met' if met else 'NOT met'}; per run: {' '.join(per_run)}")

q = first["qd"]
wide = min(q, 1000)
print()
print("targets (from the medians):")
target("eager 8 B, depth 1000 vs depth 1, window 1 both",
       "eager-8B-d1000-exact-w1", "eager-8B-d1-exact-w1", 0.8)
target(f"eager 8 B, depth 1000 (window {wide}) vs depth 1 (window 1)",
       f"eager-8B-d1000-exact-w{wide}", "eager-8B-d1-exact-w1", None)
target(f"eager 8 B at depth 1000 vs software baseline at depth 1000 (window {wide})",
       f"eager-8B-d1000-exact-w{wide}", f"baseline-8B-d1000-exact-w{wide}", 10.0)
target("rendezvous 4 MiB vs RDMA READ 4 MiB",
       next((n for n in names if n.startswith("rndv-4194304B")), "rndv-4194304B"),
       next((n for n in names if n.startswith("read-4194304B")), "read-4194304B"), 0.9, gbit=True)
sys.exit(status)
EOF
