#!/usr/bin/env python3
"""Busy against adaptive polling, in the same run (issue 16; docs/dataplane.md, "Polling").

For each case the two policies run alternately, RUNS times each, and the script prints the
medians and the ratio adaptive / busy:

  memif pair   `portico target` and `portico initiator` as two processes over net_memif,
               500 WRITE+READ pairs of 4 KiB: p50/p99 of a pair, each worker's CPU share
  write full   `portico bench write --size 64 --qd 64`: ops/s (what adaptive costs when there
               is always work)
  write 10k    the same at --rate 10000: the worker's CPU share (what adaptive saves)
  fwd full     `portico fwd` between two net_null ports: packets/s
  fwd 10k      configs/paced-fwd.toml (a generator at 10 000 frames/s, a forwarder): the
               forwarder's CPU share

CPU shares are the worker thread's own CPU time (CLOCK_THREAD_CPUTIME_ID) over the time its
loop ran, as every worker report carries them (`cpu_ns`, `wall_ns`).

Usage: scripts/bench-polling.py [--runs N] [--json FILE] [--only CASE,...]
Needs a release build (make builds one: target/release/portico).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "portico")
POLICIES = ("busy", "adaptive")


def run_json(args, timeout=120):
    """Runs portico with args; returns its last stdout line as JSON."""
    out = subprocess.run(
        [BIN] + args, capture_output=True, text=True, timeout=timeout, check=False
    )
    if out.returncode != 0:
        sys.exit(f"portico {' '.join(args)}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def share(w):
    return w["cpu_ns"] / w["wall_ns"] if w["wall_ns"] else 0.0


def memif_pair(policy):
    with tempfile.TemporaryDirectory(prefix="portico-polling-") as d:
        sock = os.path.join(d, "memif.sock")
        cfgs = {}
        for side in ("target", "initiator"):
            text = open(os.path.join(ROOT, "configs", f"memif-{side}.toml")).read()
            text = text.replace("/tmp/portico-memif.sock", sock)
            text = text.replace(f"--file-prefix=portico-{side}", f"--file-prefix=polling-{side}")
            cfgs[side] = os.path.join(d, f"{side}.toml")
            open(cfgs[side], "w").write(text)
        target = subprocess.Popen(
            [BIN, "target", "--config", cfgs["target"], "--duration", "120", "--polling", policy],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            ready = json.loads(target.stdout.readline())
            init = run_json(
                [
                    "initiator",
                    "--config", cfgs["initiator"],
                    "--polling", policy,
                    "--rkey", str(ready["rkey"]),
                    "--remote-addr", hex(ready["addr"]),
                    "--ops", "500",
                ]
            )
        finally:
            target.terminate()
            rest = target.communicate(timeout=60)[0]
        summary = json.loads(rest.strip().splitlines()[-1])
    lat = init["write_read_latency_ns"]
    return {
        "p50_us": lat["p50"] / 1e3,
        "p99_us": lat["p99"] / 1e3,
        "initiator_cpu": share(init["workers"][0]),
        "target_cpu": share(summary["workers"][0]),
    }


def bench_write(policy, rate=None):
    args = ["bench", "write", "--size", "64", "--qd", "64", "--duration", "3", "--json"]
    if rate:
        args += ["--rate", str(rate)]
    d = run_json(args + ["--polling", policy])
    r = d["results"][0]
    return {
        "ops_per_sec": r["ops_per_sec"],
        "p50_us": r["latency_ns"]["p50"] / 1e3,
        "p99_us": r["latency_ns"]["p99"] / 1e3,
        "worker_cpu": share(d["workers"][0]),
    }


def fwd_full(policy):
    d = run_json(
        ["fwd", "--cores", "1", "--duration", "3", "--json", "--polling", policy, "--",
         "--vdev", "net_null0", "--vdev", "net_null1"]
    )
    w = d["workers"][0]
    return {"mpps": w["rx_packets"] / d["seconds"] / 1e6, "worker_cpu": share(w)}


def fwd_10k(policy):
    d = run_json(
        ["run", "--config", os.path.join(ROOT, "configs", "paced-fwd.toml"), "--duration", "3",
         "--json", "--polling", policy]
    )
    w = next(w for w in d["workers"] if w["worker"] == "fwd")
    return {"pps": w["rx_packets"] / d["seconds"], "worker_cpu": share(w)}


CASES = {
    "memif": ("memif pair", memif_pair),
    "write_full": ("write full", bench_write),
    "write_10k": ("write 10k", lambda p: bench_write(p, 10000)),
    "fwd_full": ("fwd full", fwd_full),
    "fwd_10k": ("fwd 10k", fwd_10k),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="write every run and the medians here")
    ap.add_argument("--only", help="comma-separated cases: " + ",".join(CASES))
    a = ap.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit(f"{BIN}: build it first (cargo build --release)")
    cases = a.only.split(",") if a.only else list(CASES)
    report = {"runs": a.runs, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cases": {}}
    for case in cases:
        name, fn = CASES[case]
        runs = {p: [] for p in POLICIES}
        for i in range(a.runs):
            for p in POLICIES:
                runs[p].append(fn(p))
                print(f"  {name} {p} run {i + 1}: {runs[p][-1]}", file=sys.stderr)
        med = {p: {k: statistics.median(r[k] for r in runs[p]) for k in runs[p][0]} for p in POLICIES}
        report["cases"][case] = {"runs": runs, "median": med}
        print(f"{name}:")
        for k in med["busy"]:
            b, ad = med["busy"][k], med["adaptive"][k]
            ratio = f"{ad / b:.3f}" if b else "-"
            print(f"  {k:<14} busy {b:>14.3f}   adaptive {ad:>14.3f}   adaptive/busy {ratio}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
