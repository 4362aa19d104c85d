//! 24-bit packet sequence number (PSN) arithmetic.
//!
//! PSNs live in a 24-bit space that wraps from 0xFFFFFF to 0. RC keeps far
//! fewer than 2^23 packets outstanding, so two PSNs are compared by their
//! signed distance: a PSN less than half the space "ahead" is later, anything
//! else is earlier. Every comparison in the transport goes through here so
//! that no code compares raw PSNs with `<`.

/// The 24 bits a PSN (and an MSN) occupies.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// Half the PSN space: the largest distance that still orders two PSNs.
pub const PSN_HALF: u32 = 0x0080_0000;

/// `psn + n`, wrapped to 24 bits.
pub const fn add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// `psn - n`, wrapped to 24 bits.
pub const fn sub(psn: u32, n: u32) -> u32 {
    psn.wrapping_sub(n) & PSN_MASK
}

/// Signed distance `a - b` in the 24-bit space, in `-2^23 ..= 2^23 - 1`.
pub const fn diff(a: u32, b: u32) -> i32 {
    let d = a.wrapping_sub(b) & PSN_MASK;
    // Sign-extend bit 23: shift it into bit 31 and back arithmetically.
    ((d << 8) as i32) >> 8
}

/// `a` comes strictly before `b`.
pub const fn before(a: u32, b: u32) -> bool {
    diff(a, b) < 0
}

/// `a` comes before `b` or is `b`.
pub const fn before_eq(a: u32, b: u32) -> bool {
    diff(a, b) <= 0
}

/// `psn` lies in the window of `len` PSNs starting at `start` (wrap-aware).
pub const fn in_window(psn: u32, start: u32, len: u32) -> bool {
    let d = diff(psn, start);
    d >= 0 && (d as u32) < len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_sub_wrap() {
        assert_eq!(add(0xff_fffe, 1), 0xff_ffff);
        assert_eq!(add(0xff_ffff, 1), 0);
        assert_eq!(add(0xff_fff0, 0x20), 0x10);
        assert_eq!(sub(0, 1), 0xff_ffff);
        assert_eq!(sub(0x10, 0x20), 0xff_fff0);
        // Inputs with stray high bits are masked too.
        assert_eq!(add(0x0100_0000, 0), 0);
    }

    #[test]
    fn diff_is_signed_across_wrap() {
        assert_eq!(diff(5, 3), 2);
        assert_eq!(diff(3, 5), -2);
        assert_eq!(diff(0, 0xff_ffff), 1);
        assert_eq!(diff(0xff_ffff, 0), -1);
        assert_eq!(diff(0x10, 0xff_fff0), 0x20);
        assert_eq!(diff(0xff_fff0, 0x10), -0x20);
        assert_eq!(diff(7, 7), 0);
        // The extremes of the half-space.
        assert_eq!(diff(PSN_HALF - 1, 0), (PSN_HALF - 1) as i32);
        assert_eq!(diff(PSN_HALF, 0), -(PSN_HALF as i32));
    }

    #[test]
    fn ordering_across_wrap() {
        assert!(before(0xff_ffff, 0));
        assert!(!before(0, 0xff_ffff));
        assert!(before_eq(4, 4));
        assert!(!before(4, 4));
        assert!(before(0xff_fffa, 3));
    }

    #[test]
    fn window_across_wrap() {
        assert!(in_window(0xff_fffe, 0xff_fffe, 4));
        assert!(in_window(0, 0xff_fffe, 4));
        assert!(in_window(1, 0xff_fffe, 4));
        assert!(!in_window(2, 0xff_fffe, 4));
        assert!(!in_window(0xff_fffd, 0xff_fffe, 4));
        assert!(!in_window(5, 5, 0));
    }

    #[test]
    fn add_then_diff_round_trips() {
        let mut seed = 0x1234_5678_9abc_def0u64;
        for _ in 0..10_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let base = (seed as u32) & PSN_MASK;
            let n = ((seed >> 32) as u32) % PSN_HALF;
            let later = add(base, n);
            assert_eq!(diff(later, base), n as i32);
            assert_eq!(sub(later, n), base);
            assert!(before_eq(base, later));
        }
    }
}
