#!/usr/bin/env bash
# Checks the crate graph that docs/architecture.md draws against `cargo tree`: every arrow in
# the page's graph block is a real dependency, and every dependency between Portico's own
# crates is an arrow there. Then checks that no pure crate reaches DPDK, even indirectly.
# Prints the graph as cargo sees it; exits 1 on any difference.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
doc=docs/architecture.md
pure=(portico-counters portico-wire portico-proto portico-node)

members=$($cargo metadata --no-deps --format-version 1 |
    python3 -c 'import json,sys; print(" ".join(p["name"] for p in json.load(sys.stdin)["packages"]))')
actual=$(for m in $members; do
    deps=$($cargo tree -p "$m" -e normal --depth 1 --prefix none --offline 2>/dev/null |
        awk 'NR > 1 {print $1}' | sort -u | grep -xF -f <(tr ' ' '\n' <<<"$members") | tr '\n' ' ' || true)
    echo "$m -> ${deps% }" | sed "s/ *$//"
done | sort)
drawn=$(sed -n '/<!-- crate-graph: begin -->/,/<!-- crate-graph: end -->/p' "$doc" |
    grep -E '^[a-z-]+ ->' | sed 's/ *$//' | sort)
echo "crate graph (cargo tree, normal dependencies between Portico's crates):"
sed 's/^/  /' <<<"$actual"
if [[ "$actual" != "$drawn" ]]; then
    echo "check-layers: $doc draws another graph than cargo tree:" >&2
    diff <(echo "$drawn") <(echo "$actual") >&2 || true
    exit 1
fi
for p in "${pure[@]}"; do
    if $cargo tree -p "$p" -e normal --prefix none --offline 2>/dev/null | grep -q '^dpdk-sys '; then
        echo "check-layers: $p reaches dpdk-sys" >&2
        exit 1
    fi
done
echo "check-layers: $doc matches cargo tree; ${pure[*]} do not reach dpdk-sys"
