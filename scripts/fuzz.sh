#!/usr/bin/env bash
# Builds the fuzz targets of engine/fuzz on stable Rust and runs each for a bounded time.
#
#   scripts/fuzz.sh [SECONDS]        # each target SECONDS (default $FUZZ_SECONDS, else 30)
#   FUZZ_SECONDS=3600 scripts/fuzz.sh              # the offline hour, per target
#   FUZZ_TARGETS=rdma_node scripts/fuzz.sh 60      # one target
#
# The build is what `cargo fuzz build` does, without nightly: libFuzzer's coverage
# instrumentation through LLVM's sancov pass, `--cfg fuzzing`, debug assertions and overflow
# checks, release optimisation, for an explicit --target so that build scripts and proc
# macros stay uninstrumented. No AddressSanitizer: -Zsanitizer needs nightly (docs/fuzzing.md).
#
# Each target starts from its checked-in seed corpus (engine/fuzz/corpus/<target>, read only)
# plus a scratch corpus that keeps what earlier runs found (target/fuzz/corpus/<target>).
# Per target it prints executions, exec/s and coverage from libFuzzer's final line. A crash,
# timeout or out-of-memory leaves its input under target/fuzz/artifacts/<target>/, its path
# and the end of the log in the output, and makes the script exit 1 (after the other targets).
# Extra libFuzzer flags: FUZZ_ARGS. Cargo command: CARGO (default cargo).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

seconds=${1:-${FUZZ_SECONDS:-30}}
targets=${FUZZ_TARGETS:-parse_roce rdma_node}
cargo=${CARGO:-cargo}
out=$root/target/fuzz
host=$(rustc -vV | sed -n 's/^host: //p')

if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds == 0)); then
    echo "fuzz.sh: seconds per target: a positive whole number, not '$seconds'" >&2
    exit 2
fi

# libfuzzer-sys compiles libFuzzer (C++) with the cc crate: c++ (g++ here), else the clang++
# that scripts/install-deps.sh installs.
if [[ -z ${CXX:-} ]] && ! command -v c++ >/dev/null && command -v clang++ >/dev/null; then
    export CXX=clang++
fi

export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
-Cdebug-assertions -Coverflow-checks"
echo "fuzz: building $targets (release, sancov, debug assertions, overflow checks; $host)"
(cd engine/fuzz && $cargo build --release --target "$host" --target-dir "$out" --bins)
unset RUSTFLAGS

failed=()
total_execs=0
for t in $targets; do
    bin=$out/$host/release/$t
    seeds=$root/engine/fuzz/corpus/$t
    scratch=$out/corpus/$t
    artifacts=$out/artifacts/$t
    log=$out/logs/$t.log
    mkdir -p "$scratch" "$artifacts" "$(dirname "$log")"
    args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$artifacts/")
    # rdma_node inputs are sequences of frames: room for some dozens of them.
    if [[ $t == rdma_node ]]; then
        args+=(-max_len=8192)
    fi
    # shellcheck disable=SC2206 # FUZZ_ARGS is a list of flags
    args+=(${FUZZ_ARGS:-})
    echo "fuzz: $t for ${seconds}s (log $log)"
    status=0
    "$bin" "${args[@]}" "$scratch" "$seeds" >"$log" 2>&1 || status=$?
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)
    if ((status != 0)) || [[ -z $done_line ]]; then
        echo "fuzz: $t FAILED (libFuzzer exit status $status); the end of its log:"
        grep -h -A1 'panicked at' "$log" | head -n 4 | sed 's/^/    /' || true
        tail -n 40 "$log" | sed 's/^/    /'
        grep -h 'Test unit written to' "$log" | sed "s/^/fuzz: $t: /" || true
        failed+=("$t")
        continue
    fi
    execs=$(sed -E 's/^#([0-9]+).*/\1/' <<<"$done_line")
    cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$done_line")
    ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$done_line")
    corp=$(sed -nE 's/.* corp: ([0-9]+)\/.*/\1/p' <<<"$done_line")
    rate=$(sed -nE 's/.* exec\/s: ([0-9]+).*/\1/p' <<<"$done_line")
    total_execs=$((total_execs + execs))
    echo "fuzz: $t: ${seconds}s, $execs executions, $rate exec/s, cov $cov, ft $ft, corpus $corp"
    echo "      $done_line"
done

if ((${#failed[@]} > 0)); then
    echo "fuzz: FAILED: ${failed[*]}; inputs under $out/artifacts/ (check them in under engine/fuzz/regressions/<target>/)"
    exit 1
fi
echo "fuzz: $(wc -w <<<"$targets") targets, ${seconds}s each, $total_execs executions, no crash"
