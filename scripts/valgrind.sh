#!/usr/bin/env bash
# Memory-safety check of the engine itself: the pure transport (crate portico-proto) and node
# (crate portico-node) tests, no EAL, of the release-profile libraries, the code users run,
# under valgrind's memcheck. Any invalid read or write, use of uninitialised data or definite
# leak fails the run (exit 1). No suppression file: nothing it reports today is outside
# Portico (docs/toolchain.md, "Memcheck").
#
#   scripts/valgrind.sh                 # the transport, node and acceptance tests (~15 s)
#   VALGRIND_TESTS= scripts/valgrind.sh # every test of both crates (minutes)
#   VALGRIND_LIMIT=600 ...              # seconds before each crate's run is stopped (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
limit=${VALGRIND_LIMIT:-300}
# crate, then the test filters of that crate's library tests (VALGRIND_TESTS= runs them all).
suites=("portico-proto:${VALGRIND_TESTS-transport:: cm::}" "portico-node:${VALGRIND_TESTS-node:: tests::acceptance}")

if ! command -v valgrind >/dev/null; then
    echo "valgrind.sh: valgrind is not installed (scripts/install-deps.sh installs it)" >&2
    exit 1
fi
# The release test binaries exactly as `make test` built them: the Makefile passes its cargo
# arguments in RELEASE_TEST_ARGS. Any other selection (`-p` alone, or `--lib` without the
# integration tests `make test` names) resolves to other units and compiles the whole
# workspace again: 210 s of CI's 19 minutes before this was shared.
# shellcheck disable=SC2086 # the arguments are separate words
artifacts=$($cargo test --release ${RELEASE_TEST_ARGS:---workspace --lib} --no-run --message-format=json 2>/dev/null)
failed=0
for suite in "${suites[@]}"; do
    pkg=${suite%%:*}
    filters=${suite#*:}
    lib=${pkg//-/_}
    bin=$(LIB=$lib python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and m.get("executable") and t.get("name") == os.environ["LIB"] and "lib" in t.get("kind", []):
        print(m["executable"])' <<<"$artifacts")
    if [[ -z $bin ]]; then
        echo "valgrind.sh: no release test binary of $pkg" >&2
        exit 1
    fi
    log=target/valgrind-$pkg.log
    echo "valgrind: memcheck on $pkg (release), tests: ${filters:-all}, at most ${limit}s"
    set +e
    # shellcheck disable=SC2086 # the filters are separate words
    timeout "$limit" valgrind --tool=memcheck --error-exitcode=99 --leak-check=full \
        --errors-for-leak-kinds=definite --show-leak-kinds=definite -q \
        "$bin" --test-threads=2 $filters >"$log" 2>&1
    rc=$?
    set -e
    errors=$(grep -cE '^==[0-9]+== (Invalid|Conditional|Use of uninit|Syscall param|Mismatched|Source and destination)|definitely lost' "$log" || true)
    result=$(grep -E '^test result:' "$log" | tail -1)
    echo "valgrind: $pkg: ${result:-no test result}; memcheck errors: $errors (log: $log)"
    if ((rc == 124)); then
        echo "valgrind: $pkg stopped after ${limit}s" >&2
        failed=1
    elif ((rc != 0)); then
        grep -m1 -B2 -A20 -E '^==[0-9]+== [A-Z]' "$log" >&2 || tail -20 "$log" >&2
        failed=1
    fi
done
exit $failed
