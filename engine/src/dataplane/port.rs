//! Ethernet ports: any PMD (PCI NICs, `net_null`, `net_ring`, `net_tap`, `net_memif`,
//! `net_pcap`, ...) configured with RX/TX queues and started; per-queue handles that a worker
//! owns; link status, basic stats and xstats.
//!
//! A port stays started while any of its queue handles is alive (they share an `Arc`), so a
//! worker can never poll a stopped or closed device.

use std::cell::Cell;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::{DpdkError, Mempool, c_string};

/// How to set a port up.
#[derive(Debug, Clone)]
pub struct PortConfig {
    pub rx_queues: u16,
    pub tx_queues: u16,
    pub rx_desc: u16,
    pub tx_desc: u16,
    /// Take every frame on the wire, whatever its destination MAC (generators and
    /// forwarders); off for an engine with an address of its own.
    pub promiscuous: bool,
    /// The port's own MAC address to set before starting it (an engine's address), so that
    /// a port that filters by MAC passes the engine's frames. A PMD that cannot change its
    /// address is put in promiscuous mode instead, and the engine filters in software.
    pub mac: Option<[u8; 6]>,
    /// A client of a link whose other end may not be there yet (a `net_memif` client: its
    /// server refuses a connection until the server's port has started, and DPDK's memif
    /// client does not try again by itself): the port is started again, every 100 ms, until
    /// its link is up or this long has passed. `None`: started once.
    pub reconnect: Option<std::time::Duration>,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            rx_queues: 1,
            tx_queues: 1,
            rx_desc: 1024,
            tx_desc: 1024,
            promiscuous: true,
            mac: None,
            reconnect: None,
        }
    }
}

struct PortInner {
    id: u16,
    /// The driver unmaps memory under polling threads (memif): bursts are guarded
    /// (`dataplane::unmap_guard`).
    guarded: bool,
    _pool: Arc<Mempool>,
}

impl Drop for PortInner {
    fn drop(&mut self) {
        // SAFETY: the last handle to this started port is going away; no queue can be polled.
        unsafe {
            dpdk_sys::rte_eth_dev_stop(self.id);
        }
    }
}

/// A configured, started port. Queue handles are taken once each.
pub struct Port {
    inner: Arc<PortInner>,
    rss: RssState,
    name: String,
    taken_rx: Mutex<Vec<bool>>,
    taken_tx: Mutex<Vec<bool>>,
}

/// The right to poll one RX queue. `Send` (it moves to its worker) but not `Sync`: one
/// queue, one polling thread, as PMDs require.
pub struct RxQueue {
    /// Keeps the port started; `port_id` is a copy of its id, so that a burst does not
    /// first load the id through this pointer.
    _port: Arc<PortInner>,
    port_id: u16,
    queue: u16,
    /// A copy of the port's `guarded`.
    guarded: bool,
    _not_sync: PhantomData<Cell<()>>,
}

/// The right to transmit on one TX queue; `Send`, not `Sync`, as [`RxQueue`].
pub struct TxQueue {
    _port: Arc<PortInner>,
    port_id: u16,
    queue: u16,
    /// A copy of the port's `guarded`.
    guarded: bool,
    _not_sync: PhantomData<Cell<()>>,
}

impl RxQueue {
    #[inline]
    pub fn port_id(&self) -> u16 {
        self.port_id
    }
    /// Whether bursts on this queue are bracketed for `dataplane::unmap_guard`.
    #[inline]
    pub(crate) fn guarded(&self) -> bool {
        self.guarded
    }
    #[inline]
    pub fn queue_id(&self) -> u16 {
        self.queue
    }
}

impl TxQueue {
    #[inline]
    pub fn port_id(&self) -> u16 {
        self.port_id
    }
    /// Whether bursts on this queue are bracketed for `dataplane::unmap_guard`.
    #[inline]
    pub(crate) fn guarded(&self) -> bool {
        self.guarded
    }
    #[inline]
    pub fn queue_id(&self) -> u16 {
        self.queue
    }
}

fn check(what: impl FnOnce() -> String, rc: i32) -> Result<(), DpdkError> {
    if rc < 0 {
        Err(DpdkError::from_code(what(), rc))
    } else {
        Ok(())
    }
}

/// `rte_ethdev.h`'s `RTE_ETH_RSS_IPV4` and `RTE_ETH_RSS_NONFRAG_IPV4_UDP` (bits 2 and 5; they
/// are `RTE_BIT64()` macros, which bindgen does not evaluate).
const RSS_IPV4: u64 = 1 << 2;
const RSS_NONFRAG_IPV4_UDP: u64 = 1 << 5;

/// What receive-side scaling a port was started with (see [`Port::start_rss`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RssState {
    /// The hash fields asked for and supported (`rss_hf`); 0: the driver has no RSS (ring,
    /// memif, tap) and every packet goes to RX queue 0, or the port has one queue.
    pub hash_fields: u64,
    /// Entries of the redirection table the driver reports (0: none).
    pub reta_size: u16,
    /// The key asked for was set. False with RSS on means the driver takes keys of another
    /// length (i40e and ice take 52 bytes) and hashes with its own: a peer must be given that
    /// key to choose source ports.
    pub key_set: bool,
}

impl Port {
    /// Configures port `id` with `cfg`, sets its queues up (RX buffers from `pool`) and starts it.
    pub fn start(id: u16, cfg: &PortConfig, pool: Arc<Mempool>) -> Result<Port, DpdkError> {
        Port::start_rss(id, cfg, None, pool)
    }

    /// As [`Port::start`]; with `rss_key` and more than one RX queue, receive-side scaling is on
    /// for IPv4 and IPv4 UDP (what the driver supports of the two) under that key, with the
    /// driver's default redirection table (`reta[j] = j % rx_queues`). A driver without RSS
    /// takes the port without it; [`Port::rss`] says what was applied.
    pub fn start_rss(
        id: u16,
        cfg: &PortConfig,
        rss_key: Option<&[u8; 40]>,
        pool: Arc<Mempool>,
    ) -> Result<Port, DpdkError> {
        let name = port_name(id).unwrap_or_else(|| format!("port{id}"));
        let info = port_info(id)?;
        let raw = port_info_raw(id)?;
        if cfg.rx_queues == 0 && cfg.tx_queues == 0 {
            return Err(DpdkError {
                what: format!("port {name}"),
                code: 22,
                text: "needs at least one RX or TX queue".into(),
            });
        }
        if cfg.rx_queues > info.max_rx_queues || cfg.tx_queues > info.max_tx_queues {
            return Err(DpdkError {
                what: format!("port {name}"),
                code: 22,
                text: format!(
                    "asks for {} RX / {} TX queues; driver {} allows {} / {}",
                    cfg.rx_queues,
                    cfg.tx_queues,
                    info.driver,
                    info.max_rx_queues,
                    info.max_tx_queues
                ),
            });
        }
        let mut conf = dpdk_sys::rte_eth_conf::default();
        // DPDK copies the key during configuration; this copy outlives the call.
        let mut key = rss_key.copied().unwrap_or([0; 40]);
        let mut rss = RssState {
            hash_fields: 0,
            reta_size: 0,
            key_set: false,
        };
        if rss_key.is_some() && cfg.rx_queues > 1 {
            let hf = (RSS_IPV4 | RSS_NONFRAG_IPV4_UDP) & raw.flow_type_rss_offloads;
            if hf != 0 {
                conf.rxmode.mq_mode = dpdk_sys::rte_eth_rx_mq_mode_RTE_ETH_MQ_RX_RSS;
                conf.rx_adv_conf.rss_conf.rss_hf = hf;
                if raw.hash_key_size == 0 || raw.hash_key_size as usize == key.len() {
                    conf.rx_adv_conf.rss_conf.rss_key = key.as_mut_ptr();
                    conf.rx_adv_conf.rss_conf.rss_key_len = key.len() as u8;
                    rss.key_set = true;
                }
                rss.hash_fields = hf;
            }
        }
        // SAFETY: valid port id (port_info succeeded); conf is a default config with, at most,
        // RSS set, whose key pointer stays valid for the call.
        let rc =
            unsafe { dpdk_sys::rte_eth_dev_configure(id, cfg.rx_queues, cfg.tx_queues, &conf) };
        check(|| format!("configuring port {name}"), rc)?;
        if rss.hash_fields != 0 {
            rss.reta_size = port_info_raw(id).map(|i| i.reta_size).unwrap_or(0);
        }
        let socket = socket_of(id);
        for q in 0..cfg.rx_queues {
            // SAFETY: configured port; NULL rxconf means the driver default; pool outlives the
            // port (PortInner holds an Arc to it).
            let rc = unsafe {
                dpdk_sys::rte_eth_rx_queue_setup(
                    id,
                    q,
                    cfg.rx_desc,
                    socket,
                    std::ptr::null(),
                    pool.as_ptr(),
                )
            };
            check(|| format!("setting up RX queue {q} of port {name}"), rc)?;
        }
        for q in 0..cfg.tx_queues {
            // SAFETY: configured port; NULL txconf means the driver default.
            let rc = unsafe {
                dpdk_sys::rte_eth_tx_queue_setup(id, q, cfg.tx_desc, socket, std::ptr::null())
            };
            check(|| format!("setting up TX queue {q} of port {name}"), rc)?;
        }
        let mut promiscuous = cfg.promiscuous;
        if let Some(mac) = cfg.mac {
            let mut addr = dpdk_sys::rte_ether_addr { addr_bytes: mac };
            // SAFETY: configured port, pointer to a valid address for the call's duration.
            let rc = unsafe { dpdk_sys::rte_eth_dev_default_mac_addr_set(id, &mut addr) };
            // Ring and null PMDs keep whatever they have (and do not filter anyway).
            promiscuous |= rc != 0;
        }
        // SAFETY: queues are set up.
        let mut rc = unsafe { dpdk_sys::rte_eth_dev_start(id) };
        if let Some(limit) = cfg.reconnect {
            rc = Self::until_link_up(id, rc, limit);
        }
        check(|| format!("starting port {name}"), rc)?;
        if promiscuous {
            // Not every PMD supports it (net_null does not care); failure is harmless.
            // SAFETY: started port.
            unsafe { dpdk_sys::rte_eth_promiscuous_enable(id) };
        }
        Ok(Port {
            inner: Arc::new(PortInner {
                id,
                guarded: super::unmap_guard::driver_needs_guard(&info.driver),
                _pool: pool,
            }),
            rss,
            name,
            taken_rx: Mutex::new(vec![false; cfg.rx_queues as usize]),
            taken_tx: Mutex::new(vec![false; cfg.tx_queues as usize]),
        })
    }

    /// Starts port `id` again (its first start returned `rc`) until its link is up or `limit`
    /// has passed; returns the last start's code. A start that connected but whose link stayed
    /// down (a memif server that refused the client's INIT: its port was not started yet) is
    /// stopped first.
    fn until_link_up(id: u16, mut rc: i32, limit: std::time::Duration) -> i32 {
        use std::time::{Duration, Instant};
        let deadline = Instant::now() + limit;
        loop {
            if rc == 0 {
                let settle = Instant::now() + Duration::from_millis(200);
                while !link_status(id).up && Instant::now() < settle {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if link_status(id).up || Instant::now() >= deadline {
                    return rc;
                }
                // SAFETY: a started port, not yet handed to any worker.
                unsafe { dpdk_sys::rte_eth_dev_stop(id) };
            } else if Instant::now() >= deadline {
                return rc;
            }
            std::thread::sleep(Duration::from_millis(100));
            // SAFETY: a configured, stopped port.
            rc = unsafe { dpdk_sys::rte_eth_dev_start(id) };
        }
    }

    pub fn id(&self) -> u16 {
        self.inner.id
    }

    /// The receive-side scaling the port was started with.
    pub fn rss(&self) -> RssState {
        self.rss
    }

    /// Gives the port the name the user knows it by (the config's), instead of DPDK's
    /// device name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Takes RX queue `q`; `None` if it does not exist or was taken already.
    pub fn rx_queue(&self, q: u16) -> Option<RxQueue> {
        let mut taken = self.taken_rx.lock().expect("queue table");
        let slot = taken.get_mut(q as usize)?;
        if std::mem::replace(slot, true) {
            return None;
        }
        Some(RxQueue {
            _port: self.inner.clone(),
            port_id: self.inner.id,
            queue: q,
            guarded: self.inner.guarded,
            _not_sync: PhantomData,
        })
    }

    /// Takes TX queue `q`; `None` if it does not exist or was taken already.
    pub fn tx_queue(&self, q: u16) -> Option<TxQueue> {
        let mut taken = self.taken_tx.lock().expect("queue table");
        let slot = taken.get_mut(q as usize)?;
        if std::mem::replace(slot, true) {
            return None;
        }
        Some(TxQueue {
            _port: self.inner.clone(),
            port_id: self.inner.id,
            queue: q,
            guarded: self.inner.guarded,
            _not_sync: PhantomData,
        })
    }
}

/// Static facts about a port.
#[derive(Debug, Clone, Serialize)]
pub struct PortInfo {
    pub id: u16,
    pub name: String,
    pub driver: String,
    pub mac: String,
    pub socket: i32,
    pub max_rx_queues: u16,
    pub max_tx_queues: u16,
    pub rx_queues: u16,
    pub tx_queues: u16,
    pub link: LinkStatus,
}

/// Link state as the PMD reports it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct LinkStatus {
    pub up: bool,
    /// Mbit/s; 0 when unknown.
    pub speed_mbps: u32,
    pub full_duplex: bool,
    pub autoneg: bool,
}

impl std::fmt::Display for LinkStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.up {
            return write!(f, "down");
        }
        let speed = match self.speed_mbps {
            0 | u32::MAX => "unknown speed".to_string(),
            s if s >= 1000 && s.is_multiple_of(1000) => format!("{} Gbps", s / 1000),
            s => format!("{s} Mbps"),
        };
        write!(
            f,
            "up {speed} {}",
            if self.full_duplex {
                "full-duplex"
            } else {
                "half-duplex"
            }
        )
    }
}

/// The basic counters every PMD keeps.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct PortStats {
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    /// Dropped by the NIC because no RX descriptor was free.
    pub rx_missed: u64,
    pub rx_errors: u64,
    pub tx_errors: u64,
    pub rx_nombuf: u64,
}

/// Ids of all probed ports, in order.
pub fn port_ids() -> Vec<u16> {
    let mut ids = Vec::new();
    // SAFETY: iterating port ids is valid (returns RTE_MAX_ETHPORTS at the end, also before EAL).
    let mut p =
        unsafe { dpdk_sys::rte_eth_find_next_owned_by(0, dpdk_sys::RTE_ETH_DEV_NO_OWNER as u64) };
    while p < dpdk_sys::RTE_MAX_ETHPORTS as u64 {
        ids.push(p as u16);
        // SAFETY: as above.
        p = unsafe {
            dpdk_sys::rte_eth_find_next_owned_by(
                p as u16 + 1,
                dpdk_sys::RTE_ETH_DEV_NO_OWNER as u64,
            )
        };
    }
    ids
}

/// The port id of a device name (a vdev name such as `net_null0`, or a PCI address).
pub fn port_by_name(name: &str) -> Option<u16> {
    let c = c_string("port name", name).ok()?;
    let mut id = 0u16;
    // SAFETY: valid C string and out pointer.
    let rc = unsafe { dpdk_sys::rte_eth_dev_get_port_by_name(c.as_ptr(), &mut id) };
    (rc == 0).then_some(id)
}

fn port_name(id: u16) -> Option<String> {
    let mut buf = [0 as std::ffi::c_char; dpdk_sys::RTE_ETH_NAME_MAX_LEN as usize];
    // SAFETY: buf is RTE_ETH_NAME_MAX_LEN bytes, as the call requires.
    let rc = unsafe { dpdk_sys::rte_eth_dev_get_name_by_port(id, buf.as_mut_ptr()) };
    // SAFETY: on success buf holds a NUL-terminated name.
    (rc == 0).then(|| {
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    })
}

fn socket_of(id: u16) -> u32 {
    // SAFETY: plain getter; -1 (unknown) becomes SOCKET_ID_ANY's bit pattern, which DPDK accepts.
    unsafe { dpdk_sys::rte_eth_dev_socket_id(id) as u32 }
}

/// Driver, MAC, queues and link of port `id`.
pub fn port_info(id: u16) -> Result<PortInfo, DpdkError> {
    let info = port_info_raw(id)?;
    let driver = if info.driver_name.is_null() {
        String::from("?")
    } else {
        // SAFETY: non-null driver_name points at the driver's static name.
        unsafe { CStr::from_ptr(info.driver_name) }
            .to_string_lossy()
            .into_owned()
    };
    let mut mac = dpdk_sys::rte_ether_addr::default();
    // SAFETY: valid port and out pointer.
    unsafe { dpdk_sys::rte_eth_macaddr_get(id, &mut mac) };
    let b = mac.addr_bytes;
    Ok(PortInfo {
        id,
        name: port_name(id).unwrap_or_default(),
        driver,
        mac: format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        ),
        socket: socket_of(id) as i32,
        max_rx_queues: info.max_rx_queues,
        max_tx_queues: info.max_tx_queues,
        rx_queues: info.nb_rx_queues,
        tx_queues: info.nb_tx_queues,
        link: link_status(id),
    })
}

/// The driver's own `rte_eth_dev_info` of port `id`.
fn port_info_raw(id: u16) -> Result<dpdk_sys::rte_eth_dev_info, DpdkError> {
    let mut info = dpdk_sys::rte_eth_dev_info::default();
    // SAFETY: out pointer to a properly sized struct; the call validates the port id.
    let rc = unsafe { dpdk_sys::rte_eth_dev_info_get(id, &mut info) };
    check(|| format!("reading device info of port {id}"), rc)?;
    Ok(info)
}

/// Link state without waiting for auto-negotiation.
pub fn link_status(id: u16) -> LinkStatus {
    let mut link = dpdk_sys::rte_eth_link::default();
    // SAFETY: valid out pointer; an invalid port leaves the zeroed (down) link.
    unsafe { dpdk_sys::rte_eth_link_get_nowait(id, &mut link) };
    LinkStatus {
        up: link.link_status() != 0,
        speed_mbps: link.link_speed,
        full_duplex: link.link_duplex() != 0,
        autoneg: link.link_autoneg() != 0,
    }
}

/// The basic counters of port `id`.
pub fn port_stats(id: u16) -> Result<PortStats, DpdkError> {
    let mut s = dpdk_sys::rte_eth_stats::default();
    // SAFETY: valid out pointer.
    let rc = unsafe { dpdk_sys::rte_eth_stats_get(id, &mut s) };
    check(|| format!("reading stats of port {id}"), rc)?;
    Ok(PortStats {
        rx_packets: s.ipackets,
        tx_packets: s.opackets,
        rx_bytes: s.ibytes,
        tx_bytes: s.obytes,
        rx_missed: s.imissed,
        rx_errors: s.ierrors,
        tx_errors: s.oerrors,
        rx_nombuf: s.rx_nombuf,
    })
}

/// All extended statistics of port `id`, by name.
pub fn port_xstats(id: u16) -> Result<Vec<(String, u64)>, DpdkError> {
    // SAFETY: a NULL array with size 0 asks for the count.
    let n = unsafe { dpdk_sys::rte_eth_xstats_get_names(id, std::ptr::null_mut(), 0) };
    check(|| format!("counting xstats of port {id}"), n)?;
    let n = n as usize;
    let mut names = vec![dpdk_sys::rte_eth_xstat_name::default(); n];
    let mut values = vec![dpdk_sys::rte_eth_xstat::default(); n];
    // SAFETY: both arrays have n entries, as passed.
    let got_names = unsafe { dpdk_sys::rte_eth_xstats_get_names(id, names.as_mut_ptr(), n as u32) };
    check(|| format!("reading xstat names of port {id}"), got_names)?;
    // SAFETY: as above.
    let got = unsafe { dpdk_sys::rte_eth_xstats_get(id, values.as_mut_ptr(), n as u32) };
    check(|| format!("reading xstats of port {id}"), got)?;
    let got = (got as usize).min(got_names as usize).min(n);
    Ok(values[..got]
        .iter()
        .filter_map(|v| {
            let name = names.get(v.id as usize)?;
            // SAFETY: DPDK NUL-terminates xstat names within the 64-byte field.
            let name = unsafe { CStr::from_ptr(name.name.as_ptr()) }
                .to_string_lossy()
                .into_owned();
            Some((name, v.value))
        })
        .collect())
}

impl Port {
    pub fn info(&self) -> Result<PortInfo, DpdkError> {
        port_info(self.id())
    }
    pub fn link(&self) -> LinkStatus {
        link_status(self.id())
    }
    pub fn stats(&self) -> Result<PortStats, DpdkError> {
        port_stats(self.id())
    }
    pub fn xstats(&self) -> Result<Vec<(String, u64)>, DpdkError> {
        port_xstats(self.id())
    }
}

/// Creates two `net_ring` ports joined back to back in this process: what `a` transmits, `b`
/// receives, and the other way round. Returns their port ids.
pub fn ring_pair(a: &str, b: &str, ring_size: u32) -> Result<(u16, u16), DpdkError> {
    ring_pair_queues(a, b, ring_size, 1)
}

/// The most queues a `net_ring` port has (`RTE_PMD_RING_MAX_RX_RINGS` and `..._TX_RINGS` in
/// DPDK's `rte_eth_ring.h`).
pub const RING_MAX_QUEUES: u16 = 16;

/// [`ring_pair`] with `queues` queue pairs on each port: what `a` transmits on TX queue *i*,
/// `b` receives on RX queue *i*, and the other way round. There is no RSS on a ring: the queue
/// a frame arrives on is the queue it was sent on (one ring per direction and queue).
pub fn ring_pair_queues(
    a: &str,
    b: &str,
    ring_size: u32,
    queues: u16,
) -> Result<(u16, u16), DpdkError> {
    if queues == 0 || queues > RING_MAX_QUEUES {
        return Err(DpdkError {
            what: format!("ring ports {a} and {b}"),
            code: 22,
            text: format!("{queues} queues: a ring port has 1..={RING_MAX_QUEUES}"),
        });
    }
    let make_ring = |name: String| -> Result<*mut dpdk_sys::rte_ring, DpdkError> {
        let c = c_string("ring name", &name)?;
        // One producer (the sending port's TX queue) and one consumer (the peer's RX queue).
        let flags = dpdk_sys::RING_F_SP_ENQ | dpdk_sys::RING_F_SC_DEQ;
        // SAFETY: EAL is running (checked by the caller's mempool/port setup); valid name.
        let r = unsafe {
            dpdk_sys::rte_ring_create(c.as_ptr(), ring_size, dpdk_sys::SOCKET_ID_ANY, flags)
        };
        if r.is_null() {
            Err(DpdkError::from_code(format!("creating ring {name}"), 0))
        } else {
            Ok(r)
        }
    };
    // Ring names are limited to 29 bytes; derive short unique ones from the port names and
    // the queue ("pr_" for queue 0 keeps the single-queue names as they were).
    let ring_name = |from: &str, to: &str, q: u16| match q {
        0 => format!("pr_{}", short(from, to)),
        q => format!("pr{q}_{}", short(from, to)),
    };
    let mut ab = Vec::with_capacity(queues as usize);
    let mut ba = Vec::with_capacity(queues as usize);
    for q in 0..queues {
        ab.push(make_ring(ring_name(a, b, q))?);
        ba.push(make_ring(ring_name(b, a, q))?);
    }
    let from_rings =
        |name: &str, rx: &[*mut dpdk_sys::rte_ring], tx: &[*mut dpdk_sys::rte_ring]| {
            let c = c_string("port name", name)?;
            // SAFETY: `queues` valid rings each way; DPDK copies the arrays.
            let id = unsafe {
                dpdk_sys::rte_eth_from_rings(
                    c.as_ptr(),
                    rx.as_ptr(),
                    rx.len() as u32,
                    tx.as_ptr(),
                    tx.len() as u32,
                    0,
                )
            };
            if id < 0 {
                Err(DpdkError::from_code(
                    format!("creating ring port {name}"),
                    id,
                ))
            } else {
                Ok(id as u16)
            }
        };
    let pa = from_rings(a, &ba, &ab)?;
    let pb = from_rings(b, &ab, &ba)?;
    Ok((pa, pb))
}

fn short(a: &str, b: &str) -> String {
    let mut s = format!("{a}_{b}");
    s.truncate(24);
    s
}

impl PortInfo {
    /// Driver, MAC, queues and link of port `id`.
    pub fn read(id: u16) -> Result<PortInfo, DpdkError> {
        port_info(id)
    }
}

impl PortStats {
    /// The basic counters of port `id`, for a port this code holds no [`Port`] of (the
    /// `net_ring` ports inside `rdma::loopback`).
    pub fn read(id: u16) -> Result<PortStats, DpdkError> {
        port_stats(id)
    }
}
