#!/usr/bin/env bash
# Prints the Rust toolchain the tests run with, and whether it has the two MIR miscompiles
# Portico hit in the release profile (rust-lang/rust#155241 and #158206, docs/toolchain.md):
# for each, a tiny program of that shape built with `rustc -O` and run. Informational: it
# never fails the build (Portico's own code avoids the shapes; scripts/check-shapes.sh keeps
# the second out), but a line that says "present" tells whoever reads a red release-profile
# test where to look first.
set -uo pipefail
rustc_bin=${RUSTC:-rustc}
echo "toolchain: $($rustc_bin --version) ($(cargo --version 2>/dev/null || echo 'cargo ?'))"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# probe NAME ISSUE WHAT HINT: builds $dir/NAME.rs with `rustc -O` and runs it; a run that fails
# means the compiler has ISSUE.
probe() {
    if ! $rustc_bin -O --edition 2021 "$dir/$1.rs" -o "$dir/$1" 2>"$dir/err"; then
        echo "toolchain: the $2 probe did not build: $(head -1 "$dir/err")"
    elif [ "$(bash -c '"$1" >/dev/null 2>&1; echo $?' _ "$dir/$1" 2>/dev/null)" = 0 ]; then
        echo "toolchain: $2 ($3): not present"
    else
        echo "toolchain: $2 ($3): PRESENT ($4)"
    fi
}
cat >"$dir/gvn.rs" <<'RS'
// Two equal, by-value `Table::new()` arguments to a closure called twice: rustc 1.95's MIR GVN
// passes the first call's (dropped) table to the second call as well.
struct Table {
    keys: Vec<u32>,
    next: u64,
    seed: u64,
}
impl Table {
    fn new() -> Table {
        Table { keys: Vec::new(), next: 0, seed: 0 }
    }
    fn register(&mut self) -> u32 {
        self.keys.push(7 + self.next as u32 + self.seed as u32);
        self.next += 1;
        self.keys[0]
    }
}
fn main() {
    let register = |mut t: Table| t.register();
    let a = register(Table::new());
    let b = register(Table::new());
    assert_eq!((a, b), (7, 7));
}
RS
probe gvn "rust-lang/rust#155241" "MIR GVN, by-value closure argument" "the probe aborts at -O; docs/toolchain.md"

# rust-lang/rust#158206: a bool's integer value added into a place, and the bool branched on
# after; on the path where it is true, rustc 1.95's MIR optimisations add 0.
cat >"$dir/boolcast.rs" <<'RS'
#[derive(Clone, Copy, PartialEq)]
enum Slot { Empty, Full }
struct Cursor(u32);
impl Cursor {
    #[inline]
    fn take(&mut self, slots: &[Slot; 4]) -> bool {
        let hit = slots[(self.0 as usize) % 4] == Slot::Full;
        self.0 += u32::from(hit);
        hit
    }
}
#[inline(never)]
fn step(slots: &[Slot; 4], mut c: Cursor) -> u32 {
    if !c.take(slots) {
        return 9;
    }
    match slots[(c.0 as usize) % 4] { Slot::Full => 1, Slot::Empty => 2 }
}
fn main() {
    let slots = [Slot::Full, Slot::Empty, Slot::Empty, Slot::Empty];
    assert_eq!(step(std::hint::black_box(&slots), Cursor(std::hint::black_box(0))), 2);
}
RS
probe boolcast "rust-lang/rust#158206" "MIR opts, a bool added as an integer" "the probe fails at -O; docs/toolchain.md; scripts/check-shapes.sh keeps the shape out"
exit 0
