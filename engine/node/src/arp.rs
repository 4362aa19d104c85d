//! Address resolution for the connections a node starts: what a RoCE `rdma_resolve_addr`
//! does before its REQ. A bounded cache of IPv4 → MAC, filled by ARP replies to our requests
//! and by ARP requests for our address (their sender); a lookup that misses starts a
//! resolution, whose broadcast request is sent again until it is answered or `max_tries`
//! requests went unanswered. The waits between requests double from `retry_ns` to
//! `max_retry_ns`: the first answer comes soon after a peer's port appears, and a peer that
//! appears late (a rank whose port joins its bridge seconds after the others start) still
//! has about as long as Linux's neighbour table gives one (three requests a second apart).

use std::net::Ipv4Addr;

use wire::EthernetAddress;

/// How the cache behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpConfig {
    /// Entries at most, resolved and pending together.
    pub capacity: usize,
    /// The wait after the first request for an address; each later wait doubles it.
    pub retry_ns: u64,
    /// The longest wait between two requests.
    pub max_retry_ns: u64,
    /// Requests sent for one address before it is given up.
    pub max_tries: u32,
    /// How long a resolved entry is believed.
    pub ttl_ns: u64,
}

impl Default for ArpConfig {
    fn default() -> Self {
        ArpConfig {
            capacity: 256,
            retry_ns: 200_000_000,
            max_retry_ns: 1_000_000_000,
            max_tries: 5,
            ttl_ns: 60_000_000_000,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    ip: Ipv4Addr,
    mac: Option<EthernetAddress>,
    /// Requests sent so far (pending entries).
    tries: u32,
    /// Resolved: when it expires. Pending: when the next request is due.
    at: u64,
}

/// What [`ArpCache::resolve`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    Known(EthernetAddress),
    /// A request is (or will be) on its way; the answer comes through [`ArpCache::learn`].
    Pending,
    /// The cache is full of pending resolutions.
    Full,
}

/// What [`ArpCache::poll`] asks of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Send a request for this address.
    Request(Ipv4Addr),
    /// Nobody answered for this address; its entry is gone.
    Failed(Ipv4Addr),
}

/// The cache.
#[derive(Debug, Clone)]
pub struct ArpCache {
    cfg: ArpConfig,
    entries: Vec<Entry>,
    /// Entries not resolved yet: [`ArpCache::poll`] and [`ArpCache::next_due`], which a worker
    /// calls every iteration, look at nothing while there are none.
    pending: usize,
    /// Requests sent, replies learned, resolutions given up.
    pub requests: u64,
    pub learned: u64,
    pub failures: u64,
}

impl ArpCache {
    pub fn new(cfg: ArpConfig) -> ArpCache {
        ArpCache {
            cfg,
            entries: Vec::with_capacity(cfg.capacity),
            pending: 0,
            requests: 0,
            learned: 0,
            failures: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The MAC of `ip`, or a resolution started (its first request due at once).
    pub fn resolve(&mut self, now: u64, ip: Ipv4Addr) -> Resolve {
        if let Some(e) = self.entries.iter_mut().find(|e| e.ip == ip) {
            return match e.mac {
                Some(mac) if now < e.at => Resolve::Known(mac),
                Some(_) => {
                    // Expired: ask again, keep nothing stale.
                    self.pending += 1;
                    *e = Entry {
                        ip,
                        mac: None,
                        tries: 0,
                        at: now,
                    };
                    Resolve::Pending
                }
                None => Resolve::Pending,
            };
        }
        if self.entries.len() >= self.cfg.capacity {
            // Make room: the resolved entry that expires first.
            let Some(i) = (0..self.entries.len())
                .filter(|&i| self.entries[i].mac.is_some())
                .min_by_key(|&i| self.entries[i].at)
            else {
                return Resolve::Full;
            };
            self.entries.swap_remove(i);
        }
        self.entries.push(Entry {
            ip,
            mac: None,
            tries: 0,
            at: now,
        });
        self.pending += 1;
        Resolve::Pending
    }

    /// What an ARP packet told us: `ip` is at `mac`. Kept only for addresses we resolve or
    /// know already (an unsolicited packet does not fill the cache).
    pub fn learn(&mut self, now: u64, ip: Ipv4Addr, mac: EthernetAddress) -> bool {
        let Some(e) = self.entries.iter_mut().find(|e| e.ip == ip) else {
            return false;
        };
        if e.mac.is_none() {
            self.pending -= 1;
        }
        e.mac = Some(mac);
        e.at = now + self.cfg.ttl_ns;
        e.tries = 0;
        self.learned += 1;
        true
    }

    /// The MAC of `ip`, if resolved.
    pub fn known(&self, ip: Ipv4Addr) -> Option<EthernetAddress> {
        self.entries.iter().find(|e| e.ip == ip).and_then(|e| e.mac)
    }

    /// The next request due by `now`, or a resolution that failed.
    pub fn poll(&mut self, now: u64) -> Option<Due> {
        if self.pending == 0 {
            return None;
        }
        let i = self
            .entries
            .iter()
            .position(|e| e.mac.is_none() && e.at <= now)?;
        let e = &mut self.entries[i];
        if e.tries >= self.cfg.max_tries {
            let ip = e.ip;
            self.entries.swap_remove(i);
            self.pending -= 1;
            self.failures += 1;
            return Some(Due::Failed(ip));
        }
        // retry_ns × 2^tries, saturating (a shift would drop the high bits of a large one).
        let wait = 1u64
            .checked_shl(e.tries)
            .map_or(u64::MAX, |m| self.cfg.retry_ns.saturating_mul(m))
            .min(self.cfg.max_retry_ns);
        e.tries += 1;
        e.at = now + wait;
        self.requests += 1;
        Some(Due::Request(e.ip))
    }

    /// When [`ArpCache::poll`] next has something to do.
    pub fn next_due(&self) -> Option<u64> {
        if self.pending == 0 {
            return None;
        }
        self.entries
            .iter()
            .filter(|e| e.mac.is_none())
            .map(|e| e.at)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);
    const MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 9]);

    #[test]
    fn a_miss_sends_a_request_now_and_again_until_answered() {
        let mut c = ArpCache::new(ArpConfig::default());
        assert_eq!(c.resolve(0, IP), Resolve::Pending);
        assert_eq!(c.poll(0), Some(Due::Request(IP)));
        assert_eq!(c.poll(0), None, "one request per retry interval");
        assert_eq!(c.next_due(), Some(200_000_000));
        assert_eq!(c.poll(200_000_000), Some(Due::Request(IP)));
        assert_eq!(
            c.next_due(),
            Some(600_000_000),
            "the second wait is twice the first"
        );
        assert_eq!(c.poll(600_000_000), Some(Due::Request(IP)));
        assert!(c.learn(600_000_001, IP, MAC));
        assert_eq!(c.resolve(600_000_002, IP), Resolve::Known(MAC));
        assert_eq!(c.poll(u64::MAX / 2), None);
        assert_eq!(c.requests, 3);
    }

    #[test]
    fn an_address_nobody_answers_for_fails_after_max_tries() {
        let mut c = ArpCache::new(ArpConfig::default());
        c.resolve(0, IP);
        let mut t = 0;
        let mut requests = 0;
        loop {
            match c.poll(t) {
                Some(Due::Request(_)) => requests += 1,
                Some(Due::Failed(ip)) => {
                    assert_eq!(ip, IP);
                    break;
                }
                None => t = c.next_due().unwrap(),
            }
        }
        assert_eq!(requests, 5);
        // Waits of 0.2, 0.4, 0.8, 1 and 1 s: given up 3.4 s after the first request.
        assert_eq!(t, 3_400_000_000);
        assert!(c.is_empty());
        assert_eq!(c.failures, 1);
    }

    #[test]
    fn the_wait_stays_at_its_longest_however_many_requests_went_unanswered() {
        let mut c = ArpCache::new(ArpConfig {
            max_tries: 100,
            ..ArpConfig::default()
        });
        c.resolve(0, IP);
        let mut waits = Vec::new();
        let mut t = 0;
        while let Some(Due::Request(_)) = c.poll(t) {
            let next = c.next_due().unwrap();
            waits.push(next - t);
            t = next;
        }
        assert_eq!(waits.len(), 100);
        assert_eq!(&waits[..3], &[200_000_000, 400_000_000, 800_000_000]);
        assert!(waits[3..].iter().all(|&w| w == 1_000_000_000), "{waits:?}");
    }

    #[test]
    fn the_cache_is_bounded_and_evicts_resolved_entries_first() {
        let mut c = ArpCache::new(ArpConfig {
            capacity: 4,
            ..ArpConfig::default()
        });
        for i in 0..4u8 {
            let ip = Ipv4Addr::new(10, 0, 1, i);
            c.resolve(0, ip);
            if i < 2 {
                c.learn(u64::from(i), ip, MAC);
            }
        }
        // Full: a fifth address evicts the resolved entry that expires first.
        assert_eq!(c.resolve(10, Ipv4Addr::new(10, 0, 1, 9)), Resolve::Pending);
        assert_eq!(c.len(), 4);
        assert_eq!(c.known(Ipv4Addr::new(10, 0, 1, 0)), None, "evicted");
        assert_eq!(c.known(Ipv4Addr::new(10, 0, 1, 1)), Some(MAC));
        c.resolve(10, Ipv4Addr::new(10, 0, 1, 10));
        // Now every entry is pending: nothing to evict.
        assert_eq!(c.resolve(10, Ipv4Addr::new(10, 0, 1, 11)), Resolve::Full);
    }

    #[test]
    fn unsolicited_answers_do_not_fill_the_cache_and_entries_expire() {
        let mut c = ArpCache::new(ArpConfig::default());
        assert!(!c.learn(0, IP, MAC));
        assert!(c.is_empty());
        c.resolve(0, IP);
        c.learn(0, IP, MAC);
        let ttl = ArpConfig::default().ttl_ns;
        assert_eq!(c.resolve(ttl - 1, IP), Resolve::Known(MAC));
        assert_eq!(c.resolve(ttl, IP), Resolve::Pending, "expired: asked again");
    }
}
