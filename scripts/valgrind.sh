#!/usr/bin/env bash
# Memory-safety check of the engine itself: the pure node and transport tests (no EAL) of the
# release-profile library, the code users run, under valgrind's memcheck. Any invalid read or
# write, use of uninitialised data or definite leak fails the run (exit 1). No suppression
# file: nothing it reports today is outside Portico (docs/toolchain.md, "Memcheck").
#
#   scripts/valgrind.sh                 # the node, transport and acceptance tests (~15 s)
#   VALGRIND_TESTS= scripts/valgrind.sh # every library test (minutes)
#   VALGRIND_LIMIT=600 ...              # seconds before the run is stopped (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
filters=${VALGRIND_TESTS-transport:: rdma::node:: rdma::acceptance_tests}
limit=${VALGRIND_LIMIT:-300}

if ! command -v valgrind >/dev/null; then
    echo "valgrind.sh: valgrind is not installed (scripts/install-deps.sh installs it)" >&2
    exit 1
fi
bin=$($cargo test --release -p portico --lib --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("name") == "portico" and "lib" in t.get("kind", []):
        print(m["executable"])')
if [[ -z $bin ]]; then
    echo "valgrind.sh: no release test binary of the portico library" >&2
    exit 1
fi
log=target/valgrind.log
echo "valgrind: memcheck on $(basename "$bin") (release), tests: ${filters:-all}, at most ${limit}s"
set +e
# shellcheck disable=SC2086 # the filters are separate words
timeout "$limit" valgrind --tool=memcheck --error-exitcode=99 --leak-check=full \
    --errors-for-leak-kinds=definite --show-leak-kinds=definite -q \
    "$bin" --test-threads=2 $filters >"$log" 2>&1
rc=$?
set -e
errors=$(grep -cE '^==[0-9]+== (Invalid|Conditional|Use of uninit|Syscall param|Mismatched|Source and destination)|definitely lost' "$log" || true)
result=$(grep -E '^test result:' "$log" | tail -1)
echo "valgrind: ${result:-no test result}; memcheck errors: $errors (log: $log)"
if ((rc == 124)); then
    echo "valgrind: stopped after ${limit}s" >&2
    exit 1
elif ((rc != 0)); then
    grep -m1 -B2 -A20 -E '^==[0-9]+== [A-Z]' "$log" >&2 || tail -20 "$log" >&2
    exit 1
fi
