//! The baseline, `cc = dcqcn` (Zhu et al., SIGCOMM 2015), as RoCE NICs deploy it.
//!
//! **Notification point** ([`CnpPacer`]): a receiver that gets a CE-marked packet answers with
//! a CNP (opcode 0x81) to the sending queue pair, at most one per queue pair per
//! `cnp_interval_ns`.
//!
//! **Reaction point** ([`Dcqcn`]): the sender keeps a current rate RC, a target rate RT and a
//! congestion estimate α.
//! - A CNP cuts the rate, at most once per `rate_reduce_ns`: RT ← RC, RC ← RC·(1 − α/2) (never
//!   below RC·`min_dec_permille`/1000 nor `min_rate_bps`), α ← (1 − g)·α + g.
//! - α decays, α ← (1 − g)·α, for every `alpha_update_ns` without a CNP.
//! - Two counters drive the increase: a timer (`rate_increase_ns`) and a byte counter
//!   (`byte_counter` bytes sent), each restarted by a cut. Every time either expires, with T
//!   and B the expiries so far of each: if max(T, B) < F (`fast_recovery`) the step is *fast
//!   recovery*, RC ← (RT + RC)/2; if min(T, B) > F, *hyper increase*, RT += (min(T, B) − F)·R_HAI
//!   and RC ← (RT + RC)/2; otherwise *additive increase*, RT += R_AI and RC ← (RT + RC)/2.
//!   Both rates stay at or below the line rate; at the line rate the counters stop.
//!
//! α is computed lazily (the decay of the periods without a CNP is applied when it is next
//! needed), so that a flow at full rate costs no timer at all. The presets and their sources
//! are in [`DcqcnParams`]; `docs/congestion.md` lists them side by side.

/// Reaction and notification point parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct DcqcnParams {
    /// NP: at most one CNP per queue pair per this.
    pub cnp_interval_ns: u64,
    /// g, in 1/1024.
    pub g_1024: u32,
    /// α before the first CNP, in 1/1024.
    pub alpha_init_1024: u32,
    pub alpha_update_ns: u64,
    /// The shortest time between two cuts.
    pub rate_reduce_ns: u64,
    /// A cut leaves at least this share of the rate (per mille).
    pub min_dec_permille: u32,
    pub min_rate_bps: u64,
    /// The increase timer.
    pub rate_increase_ns: u64,
    /// The increase byte counter; 0: none, the stages count timer expiries only (B = T).
    pub byte_counter: u64,
    /// F: rounds of fast recovery.
    pub fast_recovery: u32,
    /// R_AI and R_HAI, for a line rate of `step_line_bps`: scaled with the line rate.
    pub rai_bps: u64,
    pub rhai_bps: u64,
    pub step_line_bps: u64,
}

impl DcqcnParams {
    /// The "vendor" preset: the HPCC simulator's `dcqcn` settings (alibaba-edu/
    /// High-Precision-Congestion-Control `simulation/run.py`, which follows the ConnectX
    /// firmware: α update every 1 µs, a cut at most every 4 µs, a 300 µs increase timer,
    /// g = 1/256, R_AI 5 Mbit/s and R_HAI 50 Mbit/s per 25 Gbit/s, one round of fast
    /// recovery), with NVIDIA's firmware defaults where the simulator has none (initial α
    /// 1023/1024, at most a halving per cut, 1 Mbit/s minimum rate). The CNP interval equals
    /// the cut period: a CNP more often than the sender may act on it is wasted. The stages
    /// count timer expiries only (no byte counter): the paper's 10 MB counter would not expire
    /// once in the few milliseconds a flow spends below its line rate here.
    pub const fn vendor() -> DcqcnParams {
        DcqcnParams {
            cnp_interval_ns: 4_000,
            g_1024: 4,
            alpha_init_1024: 1023,
            alpha_update_ns: 1_000,
            rate_reduce_ns: 4_000,
            min_dec_permille: 500,
            min_rate_bps: 1_000_000,
            rate_increase_ns: 300_000,
            byte_counter: 0,
            fast_recovery: 1,
            rai_bps: 5_000_000,
            rhai_bps: 50_000_000,
            step_line_bps: 25_000_000_000,
        }
    }

    /// The DCQCN paper's settings (§5.3, 40 GbE) with the author's ns-3 configuration
    /// (bobzhuyb/ns3-rdma `mix/config.txt`): CNPs at most every 50 µs, α and cut periods of
    /// 55 and 50 µs, a 55 µs increase timer, a 10 MB byte counter, g = 1/256, F = 5, R_AI
    /// 40 Mbit/s and R_HAI 200 Mbit/s at 40 Gbit/s.
    pub const fn paper() -> DcqcnParams {
        DcqcnParams {
            cnp_interval_ns: 50_000,
            g_1024: 4,
            alpha_init_1024: 1024,
            alpha_update_ns: 55_000,
            rate_reduce_ns: 50_000,
            min_dec_permille: 0,
            min_rate_bps: 10_000_000,
            rate_increase_ns: 55_000,
            byte_counter: 10_000_000,
            fast_recovery: 5,
            rai_bps: 40_000_000,
            rhai_bps: 200_000_000,
            step_line_bps: 40_000_000_000,
        }
    }

    /// The first field out of range, by name.
    pub fn validate(&self) -> Result<(), &'static str> {
        let checks: [(&'static str, bool); 7] = [
            ("cnp_interval_us", self.cnp_interval_ns > 0),
            ("g", (1..=1024).contains(&self.g_1024)),
            ("alpha_init", self.alpha_init_1024 <= 1024),
            ("alpha_update_us", self.alpha_update_ns > 0),
            ("rate_increase_us", self.rate_increase_ns > 0),
            ("min_dec_permille", self.min_dec_permille <= 1000),
            ("step_line_bps", self.step_line_bps > 0),
        ];
        match checks.iter().find(|(_, ok)| !ok) {
            Some((field, _)) => Err(field),
            None => Ok(()),
        }
    }
}

/// The notification point of one queue pair: CNPs at most once per interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CnpPacer {
    interval_ns: u64,
    last: Option<u64>,
    /// Marked packets that found a CNP sent within the interval.
    pub suppressed: u64,
}

impl CnpPacer {
    pub fn new(interval_ns: u64) -> CnpPacer {
        CnpPacer {
            interval_ns,
            last: None,
            suppressed: 0,
        }
    }

    /// A CE-marked packet arrived at `now`: true when a CNP goes now.
    pub fn on_marked(&mut self, now: u64) -> bool {
        match self.last {
            Some(t) if now.saturating_sub(t) < self.interval_ns => {
                self.suppressed += 1;
                false
            }
            _ => {
                self.last = Some(now);
                true
            }
        }
    }
}

/// The reaction point of one queue pair.
#[derive(Debug, Clone, PartialEq)]
pub struct Dcqcn {
    p: DcqcnParams,
    line_bps: f64,
    rai: f64,
    rhai: f64,
    rc: f64,
    rt: f64,
    alpha: f64,
    /// α is up to date at this time (a multiple of the update period after a CNP).
    alpha_at: u64,
    last_cut: Option<u64>,
    /// Next expiry of the increase timer; `None` at the line rate.
    timer_at: Option<u64>,
    timer_count: u32,
    bytes: u64,
    byte_count: u32,
    /// CNPs received, cuts made, increase steps taken.
    pub cnps: u64,
    pub cuts: u64,
    pub increases: u64,
}

impl Dcqcn {
    pub fn new(p: &DcqcnParams, line_bps: u64) -> Dcqcn {
        let line = line_bps as f64;
        let scale = line / p.step_line_bps as f64;
        Dcqcn {
            p: *p,
            line_bps: line,
            rai: p.rai_bps as f64 * scale,
            rhai: p.rhai_bps as f64 * scale,
            rc: line,
            rt: line,
            alpha: f64::from(p.alpha_init_1024) / 1024.0,
            alpha_at: 0,
            last_cut: None,
            timer_at: None,
            timer_count: 0,
            bytes: 0,
            byte_count: 0,
            cnps: 0,
            cuts: 0,
            increases: 0,
        }
    }

    fn g(&self) -> f64 {
        f64::from(self.p.g_1024) / 1024.0
    }

    /// Applies the decay of the whole update periods without a CNP up to `now`.
    fn decay_alpha(&mut self, now: u64) {
        let periods = now.saturating_sub(self.alpha_at) / self.p.alpha_update_ns;
        if periods > 0 {
            self.alpha *= (1.0 - self.g()).powf(periods as f64);
            self.alpha_at += periods * self.p.alpha_update_ns;
        }
    }

    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// The current rate, bit/s.
    pub fn rate_bps(&self) -> u64 {
        self.rc as u64
    }

    pub fn target_bps(&self) -> u64 {
        self.rt as u64
    }

    /// A CNP arrived at `now`. True when the rate changed.
    pub fn on_cnp(&mut self, now: u64) -> bool {
        self.cnps += 1;
        if self.cnps == 1 {
            // The first CNP of the flow starts α's clock.
            self.alpha_at = now;
        }
        self.decay_alpha(now);
        // The period in which a CNP arrived raises α once.
        self.alpha = (1.0 - self.g()) * self.alpha + self.g();
        self.alpha_at = now;
        if self
            .last_cut
            .is_some_and(|t| now.saturating_sub(t) < self.p.rate_reduce_ns)
        {
            return false;
        }
        self.last_cut = Some(now);
        self.cuts += 1;
        self.rt = self.rc;
        let floor = self.rc * f64::from(self.p.min_dec_permille) / 1000.0;
        self.rc = (self.rc * (1.0 - self.alpha / 2.0))
            .max(floor)
            .max(self.p.min_rate_bps as f64);
        self.timer_at = Some(now + self.p.rate_increase_ns);
        self.timer_count = 0;
        self.bytes = 0;
        self.byte_count = 0;
        true
    }

    fn increase(&mut self) {
        self.increases += 1;
        let f = self.p.fast_recovery;
        let t = self.timer_count;
        let b = if self.p.byte_counter == 0 {
            t
        } else {
            self.byte_count
        };
        if t.max(b) < f {
            // Fast recovery: halve the distance to the target.
        } else if t.min(b) > f {
            self.rt += f64::from(t.min(b) - f) * self.rhai;
        } else {
            self.rt += self.rai;
        }
        self.rt = self.rt.min(self.line_bps);
        self.rc = ((self.rt + self.rc) / 2.0).min(self.line_bps);
        if self.rc >= self.line_bps * 0.999_999 {
            self.rc = self.line_bps;
            self.rt = self.line_bps;
            self.timer_at = None;
        }
    }

    /// `bytes` were sent: the byte counter may expire (true when the rate changed).
    pub fn on_sent(&mut self, bytes: usize) -> bool {
        if self.timer_at.is_none() || self.p.byte_counter == 0 {
            return false;
        }
        self.bytes += bytes as u64;
        if self.bytes >= self.p.byte_counter {
            self.bytes -= self.p.byte_counter;
            self.byte_count += 1;
            self.increase();
            return true;
        }
        false
    }

    /// When the increase timer next expires (`None` at the line rate).
    pub fn next_deadline(&self) -> Option<u64> {
        self.timer_at
    }

    /// Runs the increase timer if it expired by `now`. True when the rate changed.
    pub fn on_timer(&mut self, now: u64) -> bool {
        let mut changed = false;
        while let Some(at) = self.timer_at {
            if at > now {
                break;
            }
            self.timer_count += 1;
            self.timer_at = Some(at + self.p.rate_increase_ns);
            self.increase();
            changed = true;
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: u64 = 25_000_000_000;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn the_notification_point_sends_one_cnp_per_interval() {
        let mut np = CnpPacer::new(50_000);
        let sent: Vec<bool> = [0, 10_000, 49_999, 50_000, 60_000, 200_000]
            .iter()
            .map(|&t| np.on_marked(t))
            .collect();
        assert_eq!(sent, [true, false, false, true, false, true]);
        assert_eq!(np.suppressed, 3);
    }

    #[test]
    fn a_cnp_cuts_by_alpha_over_two_and_alpha_follows_the_cnps() {
        let p = DcqcnParams::paper();
        let mut rp = Dcqcn::new(&p, LINE);
        assert!(rp.on_cnp(0));
        // α: 1 → (1 - g) + g = 1; RC ← RC (1 - 1/2).
        assert!(close(rp.alpha(), 1.0));
        assert_eq!(rp.rate_bps(), LINE / 2);
        assert_eq!(rp.target_bps(), LINE);
        // A second CNP within the 50 µs cut period raises α but does not cut.
        assert!(!rp.on_cnp(10_000));
        assert_eq!(rp.rate_bps(), LINE / 2);
        // 55 µs periods without a CNP decay α; the next CNP cuts by the decayed α / 2.
        rp.on_cnp(10_000 + 3 * 55_000);
        let g: f64 = 4.0 / 1024.0;
        let alpha = (1.0f64 - g).powi(3) * 1.0 * (1.0 - g) + g;
        assert!(close(rp.alpha(), alpha), "{} vs {alpha}", rp.alpha());
        let rc = (LINE / 2) as f64 * (1.0 - alpha / 2.0);
        assert!(close(rp.rate_bps() as f64, rc.floor()));
        assert_eq!(rp.target_bps(), LINE / 2);
    }

    #[test]
    fn the_vendor_preset_cuts_at_most_once_per_4_us() {
        let mut rp = Dcqcn::new(&DcqcnParams::vendor(), LINE);
        assert!(rp.on_cnp(0));
        let g: f64 = 4.0 / 1024.0;
        let alpha = (1.0 - g) * 1023.0 / 1024.0 + g;
        assert!(close(
            rp.rate_bps() as f64,
            (LINE as f64 * (1.0 - alpha / 2.0)).floor()
        ));
        assert!(!rp.on_cnp(3_999));
        assert!(rp.on_cnp(4_000));
        assert_eq!(rp.cuts, 2);
        assert_eq!(rp.cnps, 3);
    }

    #[test]
    fn recovery_goes_fast_then_additive_then_hyper() {
        let p = DcqcnParams {
            fast_recovery: 2,
            byte_counter: u64::MAX,
            ..DcqcnParams::paper()
        };
        let mut rp = Dcqcn::new(&p, LINE);
        rp.on_cnp(0);
        let (rt, mut rc) = (LINE as f64, LINE as f64 / 2.0);
        let mut expect = Vec::new();
        // Timer expiries 1 and 2 (T < F... T = 1 < 2): fast recovery; then T = 2, 3 with
        // B = 0: min(T, B) = 0 <= F: additive.
        let rai = 40e6 * LINE as f64 / 40e9;
        let mut target = rt;
        for t in 1..=4u32 {
            if t >= 2 {
                target = (target + rai).min(LINE as f64);
            }
            rc = (target + rc) / 2.0;
            expect.push(rc as u64);
        }
        let got: Vec<u64> = (1..=4u64)
            .map(|k| {
                assert!(rp.on_timer(k * 55_000));
                rp.rate_bps()
            })
            .collect();
        assert_eq!(got, expect);
        assert_eq!(rp.increases, 4);
    }

    #[test]
    fn hyper_increase_needs_both_counters_past_f() {
        let p = DcqcnParams {
            fast_recovery: 1,
            byte_counter: 1_000,
            rate_increase_ns: 1_000_000,
            ..DcqcnParams::paper()
        };
        let mut rp = Dcqcn::new(&p, LINE);
        rp.on_cnp(0);
        rp.on_cnp(50_000); // a second cut: the target is below the line rate now
        let rt0 = rp.target_bps() as f64;
        assert!(rt0 < LINE as f64);
        let rai = 40e6 * LINE as f64 / 40e9;
        let rhai = 200e6 * LINE as f64 / 40e9;
        rp.on_timer(1_050_000); // T = 1, B = 0: additive
        rp.on_timer(2_050_000); // T = 2, B = 0: additive
        rp.on_sent(1_000); // B = 1: min(T, B) = F: additive
        assert!(close(rp.target_bps() as f64, (rt0 + 3.0 * rai).floor()));
        rp.on_sent(1_000); // B = 2: min(T, B) = 2 > F: hyper, by (2 - 1) R_HAI
        assert!(close(
            rp.target_bps() as f64,
            (rt0 + 3.0 * rai + rhai).floor()
        ));
    }

    #[test]
    fn at_the_line_rate_the_counters_stop() {
        let mut rp = Dcqcn::new(&DcqcnParams::vendor(), 10_000_000_000);
        assert_eq!(rp.next_deadline(), None);
        assert!(!rp.on_sent(100_000_000));
        rp.on_cnp(0);
        assert_eq!(rp.next_deadline(), Some(300_000));
        // Enough timer expiries bring it back; then no more deadline.
        let mut t = 0;
        while rp.next_deadline().is_some() {
            t += 300_000;
            rp.on_timer(t);
            assert!(t < 10_000_000_000, "never recovered");
        }
        assert_eq!(rp.rate_bps(), 10_000_000_000);
    }

    #[test]
    fn presets_validate() {
        assert_eq!(DcqcnParams::vendor().validate(), Ok(()));
        assert_eq!(DcqcnParams::paper().validate(), Ok(()));
        let bad = DcqcnParams {
            g_1024: 0,
            ..DcqcnParams::vendor()
        };
        assert_eq!(bad.validate(), Err("g"));
    }
}
