#!/usr/bin/env bash
# Fails on source shapes the toolchain is known to miscompile in the release profile
# (docs/toolchain.md). One so far: a bool turned into an integer (`u32::from(hit)`,
# `hit as u64`), which rustc 1.95's MIR optimisations can turn into 0 on a path that branches
# on the bool afterwards (rust-lang/rust#158206). Portico writes `if hit { 1 } else { 0 }`.
#
# A heuristic over the text: it finds the spellings with the bool visible on the line (a
# comparison, a negation, an `is_*()` or `contains()` call, a literal), not a bool variable
# converted elsewhere. A line that converts integers and only looks like it says
# `check-shapes: integers` in a comment.
set -euo pipefail
cd "$(dirname "$0")/.."
int='(u8|u16|u32|u64|u128|usize|i8|i16|i32|i64|i128|isize)'
bool_inside='[^()]*(==|!=|<=|>=| < | > |\.is_[a-z_]+\(\)|\.contains\(|\.any\(|\.all\(|true|false)'
# (mawk, Debian's awk, has no `\b` or `\s`: the ends of words are spelled out.)
end_of_word='([^A-Za-z0-9_]|$)'
shape="${int}::from\\( *!|${int}::from\\(${bool_inside}|(^|[^A-Za-z0-9_])(true|false) as ${int}${end_of_word}|\\(${bool_inside}[^()]*\\) as ${int}${end_of_word}"
# Comments are left out (they name the shape to avoid).
hits=$(git ls-files '*.rs' | while read -r f; do
    awk -v f="$f" -v re="$shape" '!/check-shapes: integers/ { code = $0; sub(/\/\/.*/, "", code); if (code ~ re) print f ":" FNR ": " $0 }' "$f"
done)
if [ -n "$hits" ]; then
    echo "check-shapes: a bool turned into an integer (rust-lang/rust#158206, docs/toolchain.md);"
    echo "check-shapes: write \`if b { 1 } else { 0 }\` instead:"
    echo "$hits"
    exit 1
fi
echo "check-shapes: no bool turned into an integer"
