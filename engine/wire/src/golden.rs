//! Frames captured from real hardware, as hex text, for the tests of every crate that parses
//! or builds RoCEv2: a capture is the check of our byte layouts that does not come from our
//! own reading of the specification.

/// The bytes of a hex dump; whitespace (line breaks, spaces between fields) is ignored.
///
/// # Panics
/// On a character that is not a hex digit, or an odd number of digits: the dumps are
/// constants in tests, never input.
pub fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// CNP sent by a Mellanox ConnectX-4 Lx, from scapy's RoCE test suite
/// (`test/contrib/roce.uts`) as transcribed in
/// `reference/roce-cc-persist-anchors.md` §1.7. Captured from real hardware,
/// so its ICRC is the independent check of our recipe.
pub const CNP_CX4LX: &str = "e41d2dab2bc2 7cfe90643b32 0800
    45c2003c718c40004011 9161 0a001101 0a001201
    000012b700280000
    8100ffff4000011800000000
    00000000000000000000000000000000
    82fd002a";
