#!/usr/bin/env bash
# Issue 33's figures on a machine with the cores for them, in one run, so that a borrowed
# machine (`../shared/devkit/`, 15 minutes in all) is asked for once, with time to run it
# again. On the 2-vCPU VM, `OLD_TAGGED=1 RUNS=6 DURATION=1 WORKERS="1 2" SCALE_RUNS=2` took
# 3 min 20 s; more worker counts add their scaling points (not yet timed on a larger machine).
#
#   1. one worker, both engines on it: 64 B WRITE at queue depth 64 and 4 KiB WRITE at depth 16
#      with MTU 4096 (targets: >= 5 M ops/s, >= 60 Gbit/s), each run of this build followed by
#      one of OLD (the code before the issue) when it is given, for the ratio in the same run;
#   2. tagged eager matching on the worker against host-side matching, 8 B at depth 1 000
#      (`bench tagged --part eager,baseline --sizes 8 --depths 1000 --matching exact`; target
#      >= 5x), with OLD's two points (its whole eager and baseline parts, at 0.3 s a point) when
#      OLD_TAGGED=1;
#   3. `bench/scaling.sh` over WORKERS: inline (the application in each worker's loop) and one
#      host thread per worker, QD per worker, 64 B; then inline 4 KiB (target: 8 workers >= 7x
#      one worker's rate).
#
# Then one table: each target, the median figure, the runs, met or not. Every run's JSON is
# kept under RESULTS. Runs of one kind are interleaved (this build, OLD, this build, ...) so a
# slow spell of the machine falls on both.
#
#   bench/cores.sh    PORTICO=target/release/portico OLD=/path/to/old/portico OLD_TAGGED=1
#                     RUNS=3 DURATION=2 SCALE_RUNS=3 WORKERS="1 2 4 8"
#                     EXTRA="--hugepages off --memory-mb 512" RESULTS=bench/results/cores
#
# A packed build on the other machine (PORTICO and OLD may be commands of several words):
#
#   ../shared/devkit/pack.sh && strip -o .devkit/bin/portico-old /path/to/old/portico
#   bash bench/cores.sh   with PORTICO="bash .devkit/env.sh portico"
#                              OLD="bash .devkit/env.sh portico-old"
#
# It builds nothing: build (or pack) first. Exit status 1 when a run failed; a target not met
# is printed as such and is not a failure of the script.
set -euo pipefail
cd "$(dirname "$0")/.."

PORTICO=${PORTICO:-target/release/portico}
OLD=${OLD:-}
OLD_TAGGED=${OLD_TAGGED:-}
RUNS=${RUNS:-3}
DURATION=${DURATION:-2}
SCALE_RUNS=${SCALE_RUNS:-3}
WORKERS=${WORKERS:-"1 2 4 8"}
EXTRA=${EXTRA:-"--hugepages off --memory-mb 512"}
RESULTS=${RESULTS:-bench/results/cores}

mkdir -p "$RESULTS"
rm -rf "${RESULTS:?}"/*

echo "== the machine"
echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
echo "threads per core: $(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core: *//p')"
echo "flags: $(grep -m1 -o -w -E 'vpclmulqdq|avx512f|pclmulqdq' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "this build: $PORTICO"
[ -n "$OLD" ] && echo "old build: $OLD"

failed=0
# one run: the command, a file stem, then the bench arguments; the JSON goes to RESULTS/stem.json
bench() {
    local cmd=$1 stem=$2
    shift 2
    # shellcheck disable=SC2086  # the commands and EXTRA are words on purpose
    if ! $cmd bench "$@" --json $EXTRA >"$RESULTS/$stem.json" 2>"$RESULTS/$stem.err"; then
        echo "cores: $stem failed: $(tail -1 "$RESULTS/$stem.err")" >&2
        rm -f "$RESULTS/$stem.json"
        failed=1
    fi
}

builds=(new)
[ -n "$OLD" ] && builds+=(old)
cmd_of() { if [ "$1" = new ]; then echo "$PORTICO"; else echo "$OLD"; fi; }

echo "== one worker: 64 B and 4 KiB WRITE, ${RUNS} runs of ${DURATION} s each"
for i in $(seq 1 "$RUNS"); do
    for b in "${builds[@]}"; do
        bench "$(cmd_of "$b")" "w64-$b-r$i" write --size 64 --qd 64 --duration "$DURATION"
        bench "$(cmd_of "$b")" "w4k-$b-r$i" write --size 4096 --qd 16 --mtu 4096 \
            --duration "$DURATION"
    done
done

echo "== tagged: eager 8 B at depth 1000 against host-side matching, ${RUNS} runs"
for i in $(seq 1 "$RUNS"); do
    bench "$PORTICO" "tag-new-r$i" tagged --part eager,baseline --sizes 8 --depths 1000 \
        --matching exact --duration "$DURATION"
    if [ -n "$OLD" ] && [ -n "$OLD_TAGGED" ]; then
        # The code before the issue has no point filter: its whole two parts, shorter points.
        bench "$OLD" "tag-old-r$i" tagged --part eager,baseline --duration 0.3
    fi
done

echo "== scaling over workers: $WORKERS"
scale() { # name, then the variables for bench/scaling.sh
    local name=$1
    shift
    echo "-- $name"
    if ! env "$@" PORTICO="$PORTICO" PORTICO_NO_BUILD=1 RUNS="$SCALE_RUNS" DURATION="$DURATION" \
        WORKERS="$WORKERS" EXTRA="$EXTRA" OUT="$RESULTS/scale-$name" bench/scaling.sh; then
        failed=1
    fi
}
scale inline-64 INLINE=1 QD_PER_WORKER=1 SIZE=64 QD=120
scale threads-64 QD_PER_WORKER=1 SIZE=64 QD=120
scale inline-4k INLINE=1 QD_PER_WORKER=1 SIZE=4096 QD=16 EXTRA="$EXTRA --mtu 4096"

python3 - "$RESULTS" "$RUNS" "$SCALE_RUNS" "$WORKERS" <<'EOF'
import json, statistics, sys

out, runs, scale_runs, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def first(stem, key):
    v = load(f"{out}/{stem}.json")
    return v["results"][0][key] if v else None

def series(pattern, key, n=runs):
    got = [first(pattern.format(i=i), key) for i in range(1, n + 1)]
    return [x for x in got if x is not None]

def tagged(v, op):
    """msg/s of `op`'s 8 B point at depth 1000 in the window the run used (not window 1)."""
    if not v:
        return None
    for r in v["results"]:
        name = r.get("name", "")
        if r.get("op") == op and r.get("size") == 8 and r.get("depth") == 1000 \
                and r.get("window", 0) > 1 and not r.get("wildcards", False) \
                and "wild" not in name:
            return r["ops_per_sec"]
    return None

def trip(v):
    """The run's cache-line round trip from the host's core to its (first) worker's, in ns:
    where the two cores sat (a newer build's JSON has it; `docs/benchmarking.md`)."""
    if not v:
        return None
    cores = v.get("cores")
    if isinstance(cores, list):
        cores = cores[0] if cores else None
    trips = (cores or {}).get("line_trips") or [{}]
    return trips[0].get("round_trip_ns")

def trips(pattern, n=runs):
    got = [trip(load(f"{out}/{pattern.format(i=i)}.json")) for i in range(1, n + 1)]
    return "" if all(t is None for t in got) else \
        "  (line round trip, ns: " + ", ".join("-" if t is None else f"{t:.0f}" for t in got) + ")"

def med(xs):
    return statistics.median(xs) if xs else None

def fmt(x, unit):
    if x is None:
        return "-"
    return f"{x / 1e6:.2f} M" if unit == "ops" else f"{x:.2f}"

rows = []  # target, figure, runs, met

for stem, key, unit, goal, what in [
    ("w64", "ops_per_sec", "ops", 5e6, "64 B WRITE, one worker, ops/s (>= 5 M)"),
    ("w4k", "gbit_per_sec", "gbit", 60.0, "4 KiB WRITE, one worker, Gbit/s (>= 60)"),
]:
    new = series(stem + "-new-r{i}", key)
    old = series(stem + "-old-r{i}", key)
    m = med(new)
    ratio = f"; {m / med(old):.2f}x the old build's median" if old and m else ""
    runs_txt = ", ".join(fmt(x, unit) for x in new)
    if old:
        runs_txt += "  (old: " + ", ".join(fmt(x, unit) for x in old) + ")"
    runs_txt += trips(stem + "-new-r{i}")
    rows.append((what, fmt(m, unit) + ratio, runs_txt, None if m is None else m >= goal))

ratios, old_ratios = [], []
for i in range(1, runs + 1):
    v = load(f"{out}/tag-new-r{i}.json")
    e, b = tagged(v, "eager"), tagged(v, "baseline")
    if e and b:
        ratios.append((e, b, e / b))
    v = load(f"{out}/tag-old-r{i}.json")
    e, b = tagged(v, "eager"), tagged(v, "baseline")
    if e and b:
        old_ratios.append((e, b, e / b))
m = med([r[2] for r in ratios])
txt = ", ".join(f"{r[2]:.2f}x ({r[0] / 1e6:.2f} M / {r[1] / 1e6:.2f} M)" for r in ratios)
fig = "-" if m is None else f"{m:.2f}x"
if old_ratios and ratios:
    fig += f"; eager {med([r[0] for r in ratios]) / med([r[0] for r in old_ratios]):.2f}x the old build's"
    txt += "  (old: " + ", ".join(f"{r[2]:.2f}x" for r in old_ratios) + ")"
txt += trips("tag-new-r{i}")
rows.append(("tagged eager / host-side matching, 8 B, depth 1000 (>= 5x)", fig, txt,
             None if m is None else m >= 5.0))

def scaled(name):
    per = {}
    for n in workers:
        xs = [first(f"scale-{name}/w{n}-r{i}", "ops_per_sec") for i in range(1, scale_runs + 1)]
        per[n] = [x for x in xs if x is not None]
    return per

for name, what in [("inline-64", "8 workers / 1, 64 B, inline (>= 7x)"),
                   ("threads-64", "8 workers / 1, 64 B, a host thread each (>= 7x)"),
                   ("inline-4k", "8 workers / 1, 4 KiB, inline (>= 7x)")]:
    per = scaled(name)
    one, eight = med(per.get("1", [])), med(per.get("8", []))
    if one and eight:
        r = eight / one
        rows.append((what, f"{r:.2f}x", f"1: {fmt(one, 'ops')} ops/s, 8: {fmt(eight, 'ops')}", r >= 7.0))
    else:
        rows.append((what, "-", "8 workers not run here" if "8" not in workers else "a run failed", None))

print()
print(f"{'target':<58} {'median':<44} met")
for what, fig, runs_txt, met in rows:
    verdict = "not measured" if met is None else ("met" if met else "NOT met")
    print(f"{what:<58} {fig:<44} {verdict}")
    print(f"{'':<6}runs: {runs_txt}")
EOF
exit "$failed"
