#!/usr/bin/env bash
# Where the latency tail comes from: runs `portico bench write` at a fixed rate while
# `perf record -e sched:sched_switch -a` watches both cores, then prints, for every thread
# that took a core away from one of Portico's threads (the host loop `portico`, the workers
# `portico-*`), how often and for how long, next to the bench's own percentiles. A thread
# that is not Portico's holding the core for 1 ms shows up as a 1 ms latency for every
# operation due meanwhile (the bench measures from the intended start time).
#
#   bench/latency_tail.sh                     RATE=100000 SIZE=64 DURATION=4
#   PORTICO=path/to/portico bench/latency_tail.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-100000}
SIZE=${SIZE:-64}
DURATION=${DURATION:-4}
PORTICO=${PORTICO:-target/release/portico}
command -v perf >/dev/null || { echo "no perf: apt-get install linux-perf" >&2; exit 1; }
[ -x "$PORTICO" ] || { echo "no $PORTICO: cargo build --release" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$PORTICO" bench write --size "$SIZE" --qd 64 --rate "$RATE" --duration "$DURATION" --json \
    >"$dir/bench.json" 2>"$dir/bench.err" &
pid=$!
sleep 1.5
# Watch the middle of the run (EAL start-up and the end are not part of the measurement).
perf record -q -e sched:sched_switch -a -o "$dir/sched.data" -- sleep $((DURATION - 2)) \
    >/dev/null 2>&1 || { echo "perf record failed (needs root or perf_event_paranoid <= 0)" >&2; exit 1; }
wait "$pid"
perf script -i "$dir/sched.data" -F cpu,time,trace 2>/dev/null >"$dir/sched.txt"
python3 - "$dir/bench.json" "$dir/sched.txt" <<'PY'
import collections, json, re, sys
bench = json.load(open(sys.argv[1]))
r = bench["results"][0]
lat = r["latency_ns"]
print(f"bench write --size {bench['size']} --rate {bench['rate']:.0f}: "
      f"p50 {lat['p50']/1e3:.1f} us, p99 {lat['p99']/1e3:.1f} us, "
      f"p99.9 {lat['p99_9']/1e3:.1f} us, max {lat['max']/1e3:.0f} us")
cores = bench.get("cores")
if cores:
    print("cores:", json.dumps(cores))
out = {}
gaps = collections.defaultdict(list)
line_re = re.compile(r"\s*\[(\d+)\]\s+([\d.]+):\s+prev_comm=(.*?) prev_pid=\d+ prev_prio=\d+ "
                     r"prev_state=(\S+) ==> next_comm=(.*?) next_pid")
for line in open(sys.argv[2]):
    m = line_re.match(line)
    if not m:
        continue
    cpu, t, prev, state, nxt = int(m[1]), float(m[2]), m[3], m[4], m[5]
    if prev.startswith("portico"):
        # R: preempted (the core was taken away); S/D: the thread waited of its own accord.
        why = "preempted by " if state.startswith("R") else f"slept ({state}), then "
        out[cpu] = (t, prev, why + re.sub(r"[-/:]?\d+$", "", nxt))
    elif nxt.startswith("portico") and cpu in out:
        t0, victim, who = out.pop(cpu)
        gaps[(victim, who)].append((t - t0) * 1e6)
total = sum(sum(g) for g in gaps.values())
print(f"time Portico's threads were off their cores: {total/1e3:.1f} ms "
      f"over {bench['seconds'] - 2:.0f} s watched:")
print(f"  {'thread':14} {'why':40} {'times':>6} {'total us':>9} {'median us':>9} {'max us':>8}")
for (victim, who), g in sorted(gaps.items(), key=lambda x: -sum(x[1])):
    g.sort()
    print(f"  {victim:14} {who:40} {len(g):6d} {sum(g):9.0f} {g[len(g)//2]:9.0f} {g[-1]:8.0f}")
PY
