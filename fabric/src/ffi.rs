//! The FFI boundary: `fi_prov_ini`, every `fid` object the provider hands to libfabric, and
//! their ops tables. Each entry point converts its raw arguments (checked for null) into a call
//! of [`crate::engine::Engine`] and its result into libfabric's return convention (a count,
//! 0, or a negated `FI_E*`), inside [`guard`]: nothing unwinds into C; a panic is logged and
//! returns `-FI_EOTHER`. Every `unsafe` block says why it holds.
//!
//! Objects are `#[repr(C)]` structs whose first field is libfabric's `fid_*` (so the pointer
//! libfabric passes back is the object's), boxed at open and freed at `fi_close`. Ops tables are
//! statics; libfabric never writes them. An operation the provider does not implement answers
//! `-FI_ENOSYS` (listed in `docs/libfabric.md`).

#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use portico::rdma::MemoryRegion;

use crate::addr::{self, EpAddr};
use crate::engine::{self, Completion, Engine, Iov, Piece, err};
use crate::flags;
use crate::info::{self, Hints, Offer};
use crate::params::{self, Settings};
use crate::sys::*;

/// The provider structure libfabric keeps (it writes its own bookkeeping into `context`).
static PROVIDER: AtomicPtr<fi_provider> = AtomicPtr::new(null_mut());
/// The API version the application opened the fabric with (error entries differ before 1.5).
static API_VERSION: AtomicU32 = AtomicU32::new(info::version(1, 17));
/// The provider's own version: 0.1.
const PROV_VERSION: u32 = info::version(0, 1);

/// Log levels the provider uses.
#[derive(Clone, Copy)]
pub enum Level {
    Warn,
    Info,
    Debug,
}

fn level(l: Level) -> fi_log_level {
    match l {
        Level::Warn => FI_LOG_WARN,
        Level::Info => FI_LOG_INFO,
        Level::Debug => FI_LOG_DEBUG,
    }
}

/// Whether libfabric's log shows `level` for the provider.
pub fn log_enabled(l: Level) -> bool {
    let prov = PROVIDER.load(Ordering::Acquire);
    // SAFETY: `prov` is null (checked) or the leaked provider.
    !prov.is_null() && unsafe { fi_log_enabled(prov, level(l), FI_LOG_CORE) } != 0
}

/// Whether the debug level (the provider's per-operation trace) is on: libfabric reads its
/// log settings once, at start, so the answer is asked of it once, not per operation.
pub fn trace_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if PROVIDER.load(Ordering::Acquire).is_null() {
        return false;
    }
    *ON.get_or_init(|| log_enabled(Level::Debug))
}

/// Writes `msg` to libfabric's log (`FI_LOG_LEVEL=warn` shows warnings) under the provider's
/// name; before libfabric knows the provider, to standard error.
pub fn log(level: Level, msg: &str) {
    let prov = PROVIDER.load(Ordering::Acquire);
    let lvl = self::level(level);
    let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    if prov.is_null() {
        eprintln!("portico: {msg}");
        return;
    }
    // SAFETY: `prov` is the leaked provider from `fi_prov_ini` (never freed); the format is a
    // literal "%s\n" with one NUL-terminated argument that outlives the call.
    unsafe {
        if fi_log_enabled(prov, lvl, FI_LOG_CORE) != 0 {
            fi_log(
                prov,
                lvl,
                FI_LOG_CORE,
                c"portico".as_ptr(),
                line!() as c_int,
                c"%s\n".as_ptr(),
                text.as_ptr(),
            );
        }
    }
}

/// Runs `f`; a panic is caught (nothing unwinds into C), logged, and comes back as `None`.
fn guard(what: &str, f: impl FnOnce() -> i64) -> Option<i64> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(p) => {
            let why = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("?");
            log(
                Level::Warn,
                &format!("{what}: internal error (panic: {why}); returning -FI_EOTHER"),
            );
            None
        }
    }
}

/// [`guard`] for entry points that return `int`: a panic is `-FI_EOTHER`.
fn guard_int(what: &str, f: impl FnOnce() -> c_int) -> c_int {
    guard(what, || i64::from(f())).map_or(-(FI_EOTHER as c_int), |v| v as c_int)
}

/// [`guard`] for entry points that return `ssize_t`.
fn guard_size(what: &str, f: impl FnOnce() -> isize) -> isize {
    guard(what, || f() as i64).map_or(-(FI_EOTHER as isize), |v| v as isize)
}

fn neg(e: i32) -> c_int {
    -e
}

/// Reads a parameter's value (`FI_PORTICO_<NAME>`) through libfabric.
fn param(name: &str) -> Option<String> {
    let prov = PROVIDER.load(Ordering::Acquire);
    let cname = CString::new(name).ok()?;
    if prov.is_null() {
        return std::env::var(format!("FI_PORTICO_{}", name.to_ascii_uppercase())).ok();
    }
    let mut value: *mut c_char = null_mut();
    // SAFETY: `prov` is the registered provider; `value` receives a pointer to a string
    // libfabric owns (it is copied at once).
    let rc = unsafe {
        fi_param_get(
            prov,
            cname.as_ptr(),
            (&mut value as *mut *mut c_char).cast(),
        )
    };
    if rc != 0 || value.is_null() {
        return None;
    }
    // SAFETY: libfabric returned a NUL-terminated string (the environment's value).
    Some(
        unsafe { CStr::from_ptr(value) }
            .to_string_lossy()
            .into_owned(),
    )
}

fn settings() -> Result<Option<Settings>, params::ParamError> {
    Settings::parse(param)
}

// ---- the provider ------------------------------------------------------------------------

/// libfabric's entry point for an external provider (`FI_EXT_INI`).
#[unsafe(no_mangle)]
pub extern "C" fn fi_prov_ini() -> *mut fi_provider {
    let existing = PROVIDER.load(Ordering::Acquire);
    if !existing.is_null() {
        return existing;
    }
    let prov = Box::into_raw(Box::new(fi_provider {
        version: PROV_VERSION,
        fi_version: info::version(FI_MAJOR_VERSION, FI_MINOR_VERSION),
        context: fi_context::default(),
        name: c"portico".as_ptr(),
        getinfo: Some(getinfo),
        fabric: Some(fabric_open),
        cleanup: Some(cleanup),
    }));
    PROVIDER.store(prov, Ordering::Release);
    for p in params::PARAMS {
        let (Ok(name), Ok(help)) = (CString::new(p.name), CString::new(p.help)) else {
            continue;
        };
        // SAFETY: `prov` is valid and leaked; libfabric copies the name and formats the help
        // from "%s" and one NUL-terminated argument.
        unsafe {
            fi_param_define(
                prov,
                name.as_ptr(),
                FI_PARAM_STRING,
                c"%s".as_ptr(),
                help.as_ptr(),
            );
        }
    }
    prov
}

unsafe extern "C" fn cleanup() {}

/// Copies a C string, if not null.
unsafe fn opt_str(p: *const c_char) -> Option<String> {
    // SAFETY: the caller passes null or a NUL-terminated string.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Copies an address of `len` bytes, if not null.
unsafe fn opt_bytes(p: *const c_void, len: usize) -> Option<Vec<u8>> {
    // SAFETY: the caller passes null or `len` readable bytes.
    (!p.is_null() && len > 0)
        .then(|| unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec())
}

/// The hints, read out of the application's `fi_info`.
unsafe fn read_hints(version: u32, h: *const fi_info) -> Option<Hints> {
    // SAFETY (whole function): `h` is null or the application's fi_info, whose attribute
    // pointers are null or valid (fi_getinfo(3)).
    let h = unsafe { h.as_ref() }?;
    let mut out = Hints {
        api_version: version,
        caps: h.caps,
        mode: h.mode,
        addr_format: h.addr_format,
        // SAFETY: the application's hints: their attribute pointers and strings are null or valid (fi_getinfo(3)).
        src_addr: unsafe { opt_bytes(h.src_addr, h.src_addrlen) },
        // SAFETY: the application's hints: their attribute pointers and strings are null or valid (fi_getinfo(3)).
        dest_addr: unsafe { opt_bytes(h.dest_addr, h.dest_addrlen) },
        ..Hints::default()
    };
    // SAFETY: the application's hints: their attribute pointers and strings are null or valid (fi_getinfo(3)).
    if let Some(ep) = unsafe { h.ep_attr.as_ref() } {
        out.ep_type = ep.type_;
        out.max_msg_size = ep.max_msg_size as u64;
        out.mem_tag_format = ep.mem_tag_format;
    }
    // SAFETY: the application's hints: their attribute pointers and strings are null or valid (fi_getinfo(3)).
    if let Some(tx) = unsafe { h.tx_attr.as_ref() } {
        out.tx_caps = tx.caps;
        out.tx_mode = tx.mode;
        out.tx_op_flags = tx.op_flags;
        out.tx_msg_order = tx.msg_order;
        out.tx_inject_size = tx.inject_size;
        out.tx_size = tx.size;
        out.tx_iov_limit = tx.iov_limit;
        out.tclass = tx.tclass;
    }
    // SAFETY: the application's hints: their attribute pointers and strings are null or valid (fi_getinfo(3)).
    if let Some(rx) = unsafe { h.rx_attr.as_ref() } {
        out.rx_caps = rx.caps;
        out.rx_mode = rx.mode;
        out.rx_op_flags = rx.op_flags;
        out.rx_msg_order = rx.msg_order;
    }
    // SAFETY: the application's hints: their attribute pointers and strings are null or valid (fi_getinfo(3)).
    if let Some(d) = unsafe { h.domain_attr.as_ref() } {
        out.threading = d.threading;
        out.control_progress = d.control_progress;
        out.data_progress = d.data_progress;
        out.av_type = d.av_type;
        out.mr_mode = d.mr_mode as u32 as u64;
        out.resource_mgmt = d.resource_mgmt;
        out.cq_data_size = d.cq_data_size;
        if out.tclass == crate::tclass::UNSPEC {
            out.tclass = d.tclass;
        }
        // SAFETY: the application's hints: their attribute pointers and strings are null or valid (fi_getinfo(3)).
        out.domain_name = unsafe { opt_str(d.name) };
    }
    // SAFETY: the application's hints: their attribute pointers and strings are null or valid (fi_getinfo(3)).
    if let Some(f) = unsafe { h.fabric_attr.as_ref() } {
        // SAFETY: the application's hints: their attribute pointers and strings are null or valid (fi_getinfo(3)).
        out.fabric_name = unsafe { opt_str(f.name) };
        // SAFETY: the application's hints: their attribute pointers and strings are null or valid (fi_getinfo(3)).
        out.prov_name = unsafe { opt_str(f.prov_name) };
    }
    Some(out)
}

/// `strdup` into memory libfabric frees with `free`.
fn c_strdup(s: &str) -> *mut c_char {
    let c = CString::new(s).unwrap_or_default();
    // SAFETY: strdup copies a NUL-terminated string into malloc'd memory (or returns null).
    unsafe { libc::strdup(c.as_ptr()) }
}

fn c_addr(a: EpAddr) -> *mut c_void {
    let b = a.to_bytes();
    // SAFETY: malloc'd memory that libfabric's fi_freeinfo frees; 16 bytes written into 16.
    unsafe {
        let p = libc::malloc(addr::LEN).cast::<u8>();
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(b.as_ptr(), p, addr::LEN);
        }
        p.cast()
    }
}

/// A new `fi_info` (allocated by libfabric, so that `fi_freeinfo` frees it) describing `o`.
fn build_info(o: &Offer) -> *mut fi_info {
    // SAFETY: fi_dupinfo(NULL) allocates a zeroed fi_info with every attribute struct; each
    // pointer below is checked before it is written; strings and addresses are malloc'd.
    unsafe {
        let i = fi_dupinfo(null());
        let Some(info) = i.as_mut() else {
            return null_mut();
        };
        info.caps = o.caps;
        info.mode = o.mode;
        info.addr_format = info::SOCKADDR_IN;
        info.src_addr = c_addr(o.src_addr);
        info.src_addrlen = addr::LEN;
        if let Some(d) = o.dest_addr {
            info.dest_addr = c_addr(d);
            info.dest_addrlen = addr::LEN;
        }
        if let Some(tx) = info.tx_attr.as_mut() {
            tx.caps = o.caps;
            tx.op_flags = o.tx_op_flags;
            tx.msg_order = o.msg_order;
            tx.inject_size = info::INJECT_SIZE;
            tx.size = info::QUEUE_SIZE;
            tx.iov_limit = engine::MAX_IOV;
            tx.rma_iov_limit = 1;
            tx.tclass = o.tclass;
        }
        if let Some(rx) = info.rx_attr.as_mut() {
            rx.caps = o.caps;
            rx.op_flags = o.rx_op_flags;
            rx.msg_order = o.msg_order;
            rx.size = info::QUEUE_SIZE;
            rx.iov_limit = 1;
        }
        if let Some(ep) = info.ep_attr.as_mut() {
            ep.type_ = o.ep_type;
            ep.protocol = FI_PROTO_UNSPEC;
            ep.protocol_version = 1;
            ep.max_msg_size = info::MAX_MSG_SIZE as usize;
            ep.max_order_raw_size = info::MAX_MSG_SIZE as usize;
            ep.max_order_war_size = info::MAX_MSG_SIZE as usize;
            ep.max_order_waw_size = info::MAX_MSG_SIZE as usize;
            ep.mem_tag_format = flags::TAG_GENERIC;
            ep.tx_ctx_cnt = 1;
            ep.rx_ctx_cnt = 1;
        }
        if let Some(d) = info.domain_attr.as_mut() {
            d.name = c_strdup(&o.domain_name);
            d.threading = o.threading;
            d.control_progress = o.control_progress;
            d.data_progress = o.data_progress;
            d.resource_mgmt = FI_RM_ENABLED;
            d.av_type = o.av_type;
            d.mr_mode = o.mr_mode as c_int;
            d.mr_key_size = 4;
            d.cq_data_size = info::CQ_DATA_SIZE;
            d.cq_cnt = 256;
            d.ep_cnt = usize::from(o.endpoints);
            d.tx_ctx_cnt = usize::from(o.endpoints);
            d.rx_ctx_cnt = usize::from(o.endpoints);
            d.max_ep_tx_ctx = 1;
            d.max_ep_rx_ctx = 1;
            d.mr_iov_limit = 1;
            d.caps = flags::LOCAL_COMM | flags::REMOTE_COMM;
            d.mr_cnt = 4096;
        }
        if let Some(f) = info.fabric_attr.as_mut() {
            f.name = c_strdup(info::FABRIC);
            f.prov_version = PROV_VERSION;
        }
        i
    }
}

unsafe extern "C" fn getinfo(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const fi_info,
    out: *mut *mut fi_info,
) -> c_int {
    guard_int("fi_getinfo", || {
        if out.is_null() {
            return neg(err::EINVAL);
        }
        let s = match settings() {
            Ok(Some(s)) => s,
            Ok(None) => {
                log(Level::Info, "not configured: FI_PORTICO_DEV is not set");
                return -(FI_ENODATA as c_int);
            }
            Err(e) => {
                log(Level::Warn, &e.to_string());
                return neg(err::EINVAL);
            }
        };
        // SAFETY: libfabric passes the application's hints (or null) and strings (or null).
        let mut h = unsafe { read_hints(version, hints) };
        let (node, service) = unsafe { (opt_str(node), opt_str(service)) };
        if node.is_some() || service.is_some() {
            // node/service name an address: this engine's with FI_SOURCE, else the peer's.
            let ip = match node.as_deref().map(str::parse) {
                Some(Ok(ip)) => ip,
                Some(Err(_)) => {
                    log(
                        Level::Info,
                        &format!("node {:?} is not an IPv4 address", node.unwrap_or_default()),
                    );
                    return -(FI_ENODATA as c_int);
                }
                None => s.ip,
            };
            let port = match service.as_deref().map(str::parse) {
                Some(Ok(p)) => p,
                Some(Err(_)) => return -(FI_ENODATA as c_int),
                None => s.port,
            };
            let a = EpAddr {
                ip,
                port,
                index: port.saturating_sub(s.port),
            };
            let hh = h.get_or_insert_with(|| Hints {
                api_version: version,
                ..Hints::default()
            });
            if flags & flags::SOURCE != 0 {
                hh.src_addr = Some(a.to_bytes().to_vec());
            } else {
                hh.dest_addr = Some(a.to_bytes().to_vec());
            }
        }
        let local = EpAddr {
            ip: s.ip,
            port: s.port,
            index: 0,
        };
        let msg_local = EpAddr {
            port: s.port + s.endpoints,
            ..local
        };
        // libfabric's OFI_CORE_PROV_ONLY: a utility provider asks for a core to layer over.
        let for_layering = flags & (1 << 59) != 0 && !s.layering;
        match info::offers(
            h.as_ref(),
            local,
            msg_local,
            &s.dev,
            s.endpoints,
            for_layering,
        ) {
            Ok(list) => {
                let mut head: *mut fi_info = null_mut();
                for o in list.iter().rev() {
                    let i = build_info(o);
                    if i.is_null() {
                        // SAFETY: what was built so far is ours to free.
                        unsafe { fi_freeinfo(head) };
                        return neg(err::ENOMEM);
                    }
                    // SAFETY: `i` is a fresh fi_info.
                    unsafe { (*i).next = head };
                    head = i;
                }
                // SAFETY: `out` was checked for null.
                unsafe { *out = head };
                0
            }
            Err(m) => {
                log(Level::Info, &m.to_string());
                -(FI_ENODATA as c_int)
            }
        }
    })
}

// ---- stubs -------------------------------------------------------------------------------

macro_rules! enosys {
    ($($name:ident ( $($t:ty),* ) -> $r:ty;)*) => {$(
        unsafe extern "C" fn $name($(_: $t),*) -> $r {
            -(FI_ENOSYS as $r)
        }
    )*};
}

enosys! {
    no_bind(*mut fid, *mut fid, u64) -> c_int;
    no_control(*mut fid, c_int, *mut c_void) -> c_int;
    no_ops_open(*mut fid, *const c_char, u64, *mut *mut c_void, *mut c_void) -> c_int;
    no_ops_set(*mut fid, *const c_char, u64, *mut c_void, *mut c_void) -> c_int;
    no_wait_open(*mut fid_fabric, *mut fi_wait_attr, *mut *mut fid_wait) -> c_int;
    no_scalable_ep(*mut fid_domain, *mut fi_info, *mut *mut fid_ep, *mut c_void) -> c_int;
    no_cntr_open(*mut fid_domain, *mut fi_cntr_attr, *mut *mut fid_cntr, *mut c_void) -> c_int;
    no_poll_open(*mut fid_domain, *mut fi_poll_attr, *mut *mut fid_poll) -> c_int;
    no_stx_ctx(*mut fid_domain, *mut fi_tx_attr, *mut *mut fid_stx, *mut c_void) -> c_int;
    no_srx_ctx(*mut fid_domain, *mut fi_rx_attr, *mut *mut fid_ep, *mut c_void) -> c_int;
    no_query_atomic(*mut fid_domain, fi_datatype, fi_op, *mut fi_atomic_attr, u64) -> c_int;
    no_query_collective(*mut fid_domain, fi_collective_op, *mut fi_collective_attr, u64) -> c_int;
    no_mr_regv(*mut fid, *const iovec, usize, u64, u64, u64, u64, *mut *mut fid_mr, *mut c_void) -> c_int;
    no_cq_signal(*mut fid_cq) -> c_int;
    no_av_insertsvc(*mut fid_av, *const c_char, *const c_char, *mut fi_addr_t, u64, *mut c_void) -> c_int;
    no_av_insertsym(*mut fid_av, *const c_char, usize, *const c_char, usize, *mut fi_addr_t, u64, *mut c_void) -> c_int;
    no_av_set(*mut fid_av, *mut fi_av_set_attr, *mut *mut fid_av_set, *mut c_void) -> c_int;
    no_setopt(fid_t, c_int, c_int, *const c_void, usize) -> c_int;
    no_tx_ctx(*mut fid_ep, c_int, *mut fi_tx_attr, *mut *mut fid_ep, *mut c_void) -> c_int;
    no_rx_ctx(*mut fid_ep, c_int, *mut fi_rx_attr, *mut *mut fid_ep, *mut c_void) -> c_int;
    no_size_left(*mut fid_ep) -> isize;
    no_cancel(fid_t, *mut c_void) -> isize;
    no_setname(fid_t, *mut c_void, usize) -> c_int;
    no_getpeer(*mut fid_ep, *mut c_void, *mut usize) -> c_int;
    no_connect(*mut fid_ep, *const c_void, *const c_void, usize) -> c_int;
    no_listen(*mut fid_pep) -> c_int;
    no_accept(*mut fid_ep, *const c_void, usize) -> c_int;
    no_reject(*mut fid_pep, fid_t, *const c_void, usize) -> c_int;
    no_shutdown(*mut fid_ep, u64) -> c_int;
    no_join(*mut fid_ep, *const c_void, u64, *mut *mut fid_mc, *mut c_void) -> c_int;
    no_atomic_write(*mut fid_ep, *const c_void, usize, *mut c_void, fi_addr_t, u64, u64, fi_datatype, fi_op, *mut c_void) -> isize;
    no_atomic_writev(*mut fid_ep, *const fi_ioc, *mut *mut c_void, usize, fi_addr_t, u64, u64, fi_datatype, fi_op, *mut c_void) -> isize;
    no_atomic_writemsg(*mut fid_ep, *const fi_msg_atomic, u64) -> isize;
    no_atomic_inject(*mut fid_ep, *const c_void, usize, fi_addr_t, u64, u64, fi_datatype, fi_op) -> isize;
    no_atomic_readwrite(*mut fid_ep, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, fi_addr_t, u64, u64, fi_datatype, fi_op, *mut c_void) -> isize;
    no_atomic_readwritev(*mut fid_ep, *const fi_ioc, *mut *mut c_void, usize, *mut fi_ioc, *mut *mut c_void, usize, fi_addr_t, u64, u64, fi_datatype, fi_op, *mut c_void) -> isize;
    no_atomic_readwritemsg(*mut fid_ep, *const fi_msg_atomic, *mut fi_ioc, *mut *mut c_void, usize, u64) -> isize;
    no_atomic_compwrite(*mut fid_ep, *const c_void, usize, *mut c_void, *const c_void, *mut c_void, *mut c_void, *mut c_void, fi_addr_t, u64, u64, fi_datatype, fi_op, *mut c_void) -> isize;
    no_atomic_compwritev(*mut fid_ep, *const fi_ioc, *mut *mut c_void, usize, *const fi_ioc, *mut *mut c_void, usize, *mut fi_ioc, *mut *mut c_void, usize, fi_addr_t, u64, u64, fi_datatype, fi_op, *mut c_void) -> isize;
    no_atomic_compwritemsg(*mut fid_ep, *const fi_msg_atomic, *const fi_ioc, *mut *mut c_void, usize, *mut fi_ioc, *mut *mut c_void, usize, u64) -> isize;
    no_atomic_valid(*mut fid_ep, fi_datatype, fi_op, *mut usize) -> c_int;
    no_eq_write(*mut fid_eq, u32, *const c_void, usize, u64) -> isize;
}

unsafe extern "C" fn no_tostr(_: *const fid, _: *mut c_char, _: usize) -> c_int {
    -(FI_ENOSYS as c_int)
}

// ---- objects -----------------------------------------------------------------------------

#[repr(C)]
struct FabricObj {
    fid: fid_fabric,
    engine: Arc<Engine>,
}

#[repr(C)]
struct DomainObj {
    fid: fid_domain,
    engine: Arc<Engine>,
}

#[repr(C)]
struct CqObj {
    fid: fid_cq,
    engine: Arc<Engine>,
    id: usize,
    format: u32,
    /// The AV of the endpoint last bound to it (for `fi_cq_readfrom`).
    av: Option<usize>,
    /// `FI_WAIT_FD`: the descriptor `fi_control(FI_GETWAIT)` gives (readable when the engine
    /// has published to a host that called `fi_trywait`).
    wait_fd: Option<std::os::fd::OwnedFd>,
}

#[repr(C)]
struct AvObj {
    fid: fid_av,
    engine: Arc<Engine>,
    id: usize,
}

#[repr(C)]
struct EpObj {
    fid: fid_ep,
    engine: Arc<Engine>,
    id: usize,
}

#[repr(C)]
struct MrObj {
    fid: fid_mr,
    engine: Arc<Engine>,
    mr: Option<MemoryRegion>,
}

#[repr(C)]
struct EqObj {
    fid: fid_eq,
    engine: Arc<Engine>,
    id: usize,
    /// The last error entry's data (`fi_eq_readerr` points `err_data` at it).
    err_data: Vec<u8>,
}

#[repr(C)]
struct PepObj {
    fid: fid_pep,
    engine: Arc<Engine>,
    id: usize,
}

/// `info->handle` of an `FI_CONNREQ` event: names the request for `fi_endpoint` and
/// `fi_reject`.
#[repr(C)]
struct ConnReqObj {
    fid: fid,
    id: u32,
}

fn fid_header(fclass: u32, context: *mut c_void, ops: &'static fi_ops) -> fid {
    fid {
        fclass: fclass as usize,
        context,
        ops: (ops as *const fi_ops).cast_mut(),
    }
}

/// Boxes `obj` and stores its address in `*out` as libfabric's type `F`.
unsafe fn hand_out<T, F>(obj: T, out: *mut *mut F) -> c_int {
    let p = Box::into_raw(Box::new(obj));
    // SAFETY: `out` was checked for null by the caller; `T` starts with an `F` (repr(C)).
    unsafe { *out = p.cast::<F>() };
    0
}

/// The object behind a fid libfabric passes back.
unsafe fn obj<'a, T>(p: *mut impl Sized) -> Option<&'a mut T> {
    // SAFETY: the caller passes a pointer this provider handed out as `T` (libfabric calls an
    // object's ops only with that object), or null.
    unsafe { p.cast::<T>().as_mut() }
}

/// Frees an object handed out by [`hand_out`].
unsafe fn free<T>(p: *mut fid) {
    // SAFETY: `p` came from `Box::into_raw` of a `T` and is closed once.
    drop(unsafe { Box::from_raw(p.cast::<T>()) });
}

/// `fi_close` of an object that is an engine-side id: the engine forgets the id, then the
/// object is freed.
macro_rules! id_close {
    ($name:ident, $ty:ty, $what:literal, $method:ident) => {
        unsafe extern "C" fn $name(f: *mut fid) -> c_int {
            guard_int($what, || {
                // SAFETY: `f` is this provider's object of type `$ty` (libfabric calls an
                // object's close only with that object).
                let Some(o) = (unsafe { obj::<$ty>(f) }) else {
                    return neg(err::EINVAL);
                };
                o.engine.$method(o.id);
                // SAFETY: as above, and closed once.
                unsafe { free::<$ty>(f) };
                0
            })
        }
    };
}

// ---- fabric ------------------------------------------------------------------------------

static FABRIC_FI_OPS: fi_ops = fi_ops {
    size: size_of::<fi_ops>(),
    close: Some(fabric_close),
    bind: Some(no_bind),
    control: Some(no_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static FABRIC_OPS: fi_ops_fabric = fi_ops_fabric {
    size: size_of::<fi_ops_fabric>(),
    domain: Some(domain_open),
    passive_ep: Some(passive_ep),
    eq_open: Some(eq_open),
    wait_open: Some(no_wait_open),
    trywait: Some(trywait),
    domain2: Some(domain_open2),
};

/// Restores the calling thread's CPU affinity around `f` (EAL pins the thread that starts it
/// to its main lcore; the application's thread keeps the CPUs it had).
fn keeping_affinity(f: &mut dyn FnMut() -> Result<(), String>) -> Result<(), String> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity/sched_setaffinity on the calling
    // thread (pid 0) with its own size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let saved = libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) == 0;
        let r = f();
        if saved {
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
        }
        r
    }
}

/// The application's memory as a [`pmem::Mapping`], registered in place (with `file`: the
/// shared mapping of that file that `/proc/self/maps` showed holding the range).
fn borrow(
    addr: usize,
    len: usize,
    file: Option<std::path::PathBuf>,
) -> Result<Arc<pmem::Mapping>, String> {
    // SAFETY: libfabric's registration contract, as verbs': memory the application registers
    // (fi_mr_reg, or a buffer it names in an operation) stays mapped until it closes the MR
    // (or the operation completes); the engine touches only the bytes operations name. The
    // implicit region over the whole address space is used for local access only: no key of
    // it leaves the process. A range with `file` was a shared mapping of it when registered,
    // and stays one under the same contract.
    let map = unsafe {
        match file {
            Some(path) => pmem::Mapping::borrowed_file(addr as *mut u8, len, path),
            None => pmem::Mapping::borrowed(addr as *mut u8, len),
        }
    };
    map.map(Arc::new).map_err(|e| e.to_string())
}

unsafe extern "C" fn fabric_open(
    attr: *mut fi_fabric_attr,
    fabric: *mut *mut fid_fabric,
    context: *mut c_void,
) -> c_int {
    guard_int("fi_fabric", || {
        if fabric.is_null() {
            return neg(err::EINVAL);
        }
        // SAFETY: `attr` is null or the fabric attributes from fi_getinfo.
        if let Some(a) = unsafe { attr.as_ref() } {
            if a.api_version != 0 {
                API_VERSION.store(a.api_version, Ordering::Relaxed);
            }
            // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
            if let Some(name) = unsafe { opt_str(a.name) }
                && name != info::FABRIC
            {
                return -(FI_ENODATA as c_int);
            }
        }
        let s = match settings() {
            Ok(Some(s)) => s,
            Ok(None) => {
                log(Level::Warn, "fi_fabric: FI_PORTICO_DEV is not set");
                return -(FI_ENODATA as c_int);
            }
            Err(e) => {
                log(Level::Warn, &e.to_string());
                return neg(err::EINVAL);
            }
        };
        let engine = match engine::get_or_start(&s, borrow, keeping_affinity) {
            Ok(e) => e,
            Err(e) => {
                log(
                    Level::Warn,
                    &format!("fi_fabric: the engine did not start: {e}"),
                );
                return neg(err::EIO);
            }
        };
        let api = API_VERSION.load(Ordering::Relaxed);
        let obj = FabricObj {
            fid: fid_fabric {
                fid: fid_header(FI_CLASS_FABRIC, context, &FABRIC_FI_OPS),
                ops: (&FABRIC_OPS as *const fi_ops_fabric).cast_mut(),
                api_version: api,
            },
            engine,
        };
        // SAFETY: `fabric` was checked for null.
        unsafe { hand_out(obj, fabric) }
    })
}

unsafe extern "C" fn fabric_close(f: *mut fid) -> c_int {
    // The engine lives as long as the process (EAL cannot start twice).
    guard_int("fi_close(fabric)", || {
        // SAFETY: `f` is a FabricObj this provider handed out.
        unsafe { free::<FabricObj>(f) };
        0
    })
}

// ---- domain ------------------------------------------------------------------------------

static DOMAIN_FI_OPS: fi_ops = fi_ops {
    size: size_of::<fi_ops>(),
    close: Some(domain_close),
    bind: Some(no_bind),
    control: Some(no_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static DOMAIN_OPS: fi_ops_domain = fi_ops_domain {
    size: size_of::<fi_ops_domain>(),
    av_open: Some(av_open),
    cq_open: Some(cq_open),
    endpoint: Some(ep_open),
    scalable_ep: Some(no_scalable_ep),
    cntr_open: Some(no_cntr_open),
    poll_open: Some(no_poll_open),
    stx_ctx: Some(no_stx_ctx),
    srx_ctx: Some(no_srx_ctx),
    query_atomic: Some(no_query_atomic),
    query_collective: Some(no_query_collective),
    endpoint2: Some(ep_open2),
};

static MR_OPS: fi_ops_mr = fi_ops_mr {
    size: size_of::<fi_ops_mr>(),
    reg: Some(mr_reg),
    regv: Some(no_mr_regv),
    regattr: Some(mr_regattr),
};

unsafe extern "C" fn domain_open(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    dom: *mut *mut fid_domain,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded as received.
    unsafe { domain_open2(fabric, info, dom, 0, context) }
}

unsafe extern "C" fn domain_open2(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    dom: *mut *mut fid_domain,
    _flags: u64,
    context: *mut c_void,
) -> c_int {
    guard_int("fi_domain", || {
        // SAFETY: `fabric` is our FabricObj.
        let Some(f) = (unsafe { obj::<FabricObj>(fabric) }) else {
            return neg(err::EINVAL);
        };
        if dom.is_null() {
            return neg(err::EINVAL);
        }
        // SAFETY: `info` is null or an fi_info from fi_getinfo.
        if let Some(i) = unsafe { info.as_ref() }
            && let Some(d) = unsafe { i.domain_attr.as_ref() }
            && let Some(name) = unsafe { opt_str(d.name) }
            && name != info::domain_name(&f.engine.settings.dev)
        {
            return neg(err::EINVAL);
        }
        let obj = DomainObj {
            fid: fid_domain {
                fid: fid_header(FI_CLASS_DOMAIN, context, &DOMAIN_FI_OPS),
                ops: (&DOMAIN_OPS as *const fi_ops_domain).cast_mut(),
                mr: (&MR_OPS as *const fi_ops_mr).cast_mut(),
            },
            engine: f.engine.clone(),
        };
        // SAFETY: `dom` was checked.
        unsafe { hand_out(obj, dom) }
    })
}

unsafe extern "C" fn domain_close(f: *mut fid) -> c_int {
    guard_int("fi_close(domain)", || {
        // SAFETY: our DomainObj.
        unsafe { free::<DomainObj>(f) };
        0
    })
}

// ---- memory registration -----------------------------------------------------------------

static MR_FI_OPS: fi_ops = fi_ops {
    size: size_of::<fi_ops>(),
    close: Some(mr_close),
    bind: Some(no_bind),
    control: Some(no_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn mr_reg(
    domain: *mut fid,
    buf: *const c_void,
    len: usize,
    access: u64,
    _offset: u64,
    _requested_key: u64,
    _flags: u64,
    mr: *mut *mut fid_mr,
    context: *mut c_void,
) -> c_int {
    guard_int("fi_mr_reg", || {
        // SAFETY: `domain` is our DomainObj's fid.
        let Some(d) = (unsafe { obj::<DomainObj>(domain) }) else {
            return neg(err::EINVAL);
        };
        if mr.is_null() || buf.is_null() || len == 0 {
            return neg(err::EINVAL);
        }
        let region = match d.engine.mr_reg(buf as usize, len, access) {
            Ok(r) => r,
            Err(e) => {
                log(
                    Level::Warn,
                    &format!("fi_mr_reg of {len} bytes at {buf:p}: {e}"),
                );
                return neg(err::ENOMEM);
            }
        };
        let key = u64::from(region.rkey());
        let obj = Box::into_raw(Box::new(MrObj {
            fid: fid_mr {
                fid: fid_header(FI_CLASS_MR, context, &MR_FI_OPS),
                mem_desc: null_mut(),
                key,
            },
            engine: d.engine.clone(),
            mr: Some(region),
        }));
        // SAFETY: `obj` is fresh; its descriptor is the object itself (ops find the lkey there).
        unsafe {
            (*obj).fid.mem_desc = obj.cast();
            *mr = obj.cast();
        }
        0
    })
}

unsafe extern "C" fn mr_regattr(
    domain: *mut fid,
    attr: *const fi_mr_attr,
    flags: u64,
    mr: *mut *mut fid_mr,
) -> c_int {
    // SAFETY: `attr` is null or the application's attributes with `iov_count` iovecs.
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return neg(err::EINVAL);
    };
    if a.iov_count != 1 || a.mr_iov.is_null() {
        return neg(err::EINVAL);
    }
    // SAFETY: one iovec, checked above.
    let iov = unsafe { *a.mr_iov };
    unsafe {
        mr_reg(
            domain,
            iov.iov_base,
            iov.iov_len,
            a.access,
            a.offset,
            a.requested_key,
            flags,
            mr,
            a.context,
        )
    }
}

unsafe extern "C" fn mr_close(f: *mut fid) -> c_int {
    guard_int("fi_close(mr)", || {
        // SAFETY: our MrObj.
        let Some(m) = (unsafe { obj::<MrObj>(f) }) else {
            return neg(err::EINVAL);
        };
        if let Some(region) = m.mr.take()
            && let Err(e) = m.engine.mr_close(region)
        {
            log(Level::Warn, &format!("fi_close(mr): {e}"));
        }
        // SAFETY: closed once.
        unsafe { free::<MrObj>(f) };
        0
    })
}

/// The lkey a descriptor names (`fi_mr_desc` of one of this provider's MRs), if any.
fn desc_lkey(desc: *mut c_void) -> Option<u32> {
    // SAFETY: a descriptor is null or the `mem_desc` of an MrObj this provider made (the
    // application passes back what fi_mr_desc gave it).
    let m = unsafe { desc.cast::<MrObj>().as_ref() }?;
    m.mr.as_ref().map(|r| r.lkey())
}

// ---- completion queues -------------------------------------------------------------------

static CQ_FI_OPS: fi_ops = fi_ops {
    size: size_of::<fi_ops>(),
    close: Some(cq_close),
    bind: Some(no_bind),
    control: Some(cq_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static CQ_OPS: fi_ops_cq = fi_ops_cq {
    size: size_of::<fi_ops_cq>(),
    read: Some(cq_read),
    readfrom: Some(cq_readfrom),
    readerr: Some(cq_readerr),
    sread: Some(cq_sread),
    sreadfrom: Some(cq_sreadfrom),
    signal: Some(no_cq_signal),
    strerror: Some(cq_strerror),
};

unsafe extern "C" fn cq_open(
    domain: *mut fid_domain,
    attr: *mut fi_cq_attr,
    cq: *mut *mut fid_cq,
    context: *mut c_void,
) -> c_int {
    guard_int("fi_cq_open", || {
        // SAFETY: our DomainObj; `attr` is the application's.
        let Some(d) = (unsafe { obj::<DomainObj>(domain) }) else {
            return neg(err::EINVAL);
        };
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
        let Some(a) = (unsafe { attr.as_ref() }) else {
            return neg(err::EINVAL);
        };
        if cq.is_null() {
            return neg(err::EINVAL);
        }
        let format = match a.format {
            FI_CQ_FORMAT_UNSPEC => FI_CQ_FORMAT_CONTEXT,
            f @ (FI_CQ_FORMAT_CONTEXT | FI_CQ_FORMAT_MSG | FI_CQ_FORMAT_DATA
            | FI_CQ_FORMAT_TAGGED) => f,
            _ => return neg(err::ENOSYS),
        };
        let wait_fd = match a.wait_obj {
            FI_WAIT_NONE | FI_WAIT_UNSPEC => None,
            FI_WAIT_FD => match d.engine.wait_fd() {
                Ok(fd) => Some(fd),
                Err(e) => {
                    log(
                        Level::Warn,
                        &format!("fi_cq_open: the FI_WAIT_FD descriptor: {e}"),
                    );
                    return neg(err::ENOMEM);
                }
            },
            _ => {
                log(
                    Level::Warn,
                    "fi_cq_open: wait objects FI_WAIT_NONE, FI_WAIT_UNSPEC and FI_WAIT_FD only",
                );
                return neg(err::ENOSYS);
            }
        };
        let id = d.engine.cq_open();
        let obj = CqObj {
            fid: fid_cq {
                fid: fid_header(FI_CLASS_CQ, context, &CQ_FI_OPS),
                ops: (&CQ_OPS as *const fi_ops_cq).cast_mut(),
            },
            engine: d.engine.clone(),
            id,
            format,
            av: None,
            wait_fd,
        };
        // SAFETY: checked.
        unsafe { hand_out(obj, cq) }
    })
}

unsafe extern "C" fn cq_control(f: *mut fid, command: c_int, arg: *mut c_void) -> c_int {
    guard_int("fi_control(cq)", || {
        // SAFETY: our CqObj.
        let Some(c) = (unsafe { obj::<CqObj>(f) }) else {
            return neg(err::EINVAL);
        };
        match command as u32 {
            FI_GETWAIT => {
                use std::os::fd::AsRawFd;
                let Some(fd) = &c.wait_fd else {
                    return neg(err::ENODATA);
                };
                // SAFETY: `arg` points at an int for the descriptor (fi_control(3), FI_WAIT_FD).
                match unsafe { arg.cast::<c_int>().as_mut() } {
                    Some(out) => {
                        *out = fd.as_raw_fd();
                        0
                    }
                    None => neg(err::EINVAL),
                }
            }
            _ => neg(err::ENOSYS),
        }
    })
}

unsafe extern "C" fn trywait(fabric: *mut fid_fabric, fids: *mut *mut fid, count: c_int) -> c_int {
    guard_int("fi_trywait", || {
        if fabric.is_null() || (fids.is_null() && count > 0) || count < 0 {
            return neg(err::EINVAL);
        }
        let mut engine = None;
        let mut cqs = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            // SAFETY: the application's array of `count` fids (fi_trywait(3)).
            let f = unsafe { *fids.add(i) };
            // SAFETY: a fid the application opened: its header is readable.
            let Some(h) = (unsafe { f.as_ref() }) else {
                return neg(err::EINVAL);
            };
            if h.fclass != FI_CLASS_CQ as usize || !std::ptr::eq(h.ops, &CQ_FI_OPS) {
                log(
                    Level::Warn,
                    "fi_trywait: completion queues of this provider only",
                );
                return neg(err::EINVAL);
            }
            // SAFETY: checked above: one of our CqObjs.
            let Some(c) = (unsafe { obj::<CqObj>(f) }) else {
                return neg(err::EINVAL);
            };
            cqs.push(c.id);
            engine = Some(c.engine.clone());
        }
        match engine {
            Some(e) if !e.try_wait(&cqs) => neg(err::EAGAIN),
            _ => 0,
        }
    })
}

id_close!(cq_close, CqObj, "fi_close(cq)", cq_close);

/// Writes `c` as `format` at entry `i` of `buf`.
unsafe fn write_entry(format: u32, buf: *mut c_void, i: usize, c: &Completion) {
    // SAFETY: the caller's buffer holds at least `i + 1` entries of `format` (fi_cq_read(3)).
    unsafe {
        match format {
            FI_CQ_FORMAT_CONTEXT => {
                *buf.cast::<fi_cq_entry>().add(i) = fi_cq_entry {
                    op_context: c.context as *mut c_void,
                }
            }
            FI_CQ_FORMAT_MSG => {
                *buf.cast::<fi_cq_msg_entry>().add(i) = fi_cq_msg_entry {
                    op_context: c.context as *mut c_void,
                    flags: c.flags,
                    len: c.len as usize,
                }
            }
            FI_CQ_FORMAT_DATA => {
                *buf.cast::<fi_cq_data_entry>().add(i) = fi_cq_data_entry {
                    op_context: c.context as *mut c_void,
                    flags: c.flags,
                    len: c.len as usize,
                    buf: c.buf as *mut c_void,
                    data: c.data,
                }
            }
            _ => {
                *buf.cast::<fi_cq_tagged_entry>().add(i) = fi_cq_tagged_entry {
                    op_context: c.context as *mut c_void,
                    flags: c.flags,
                    len: c.len as usize,
                    buf: c.buf as *mut c_void,
                    data: c.data,
                    tag: c.tag,
                }
            }
        }
    }
}

unsafe fn cq_read_inner(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut fi_addr_t,
) -> isize {
    // SAFETY: our CqObj.
    let Some(c) = (unsafe { obj::<CqObj>(cq) }) else {
        return -(err::EINVAL as isize);
    };
    if buf.is_null() || count == 0 {
        return -(err::EINVAL as isize);
    }
    // On the stack: a CQ read allocates nothing.
    let mut out = [Completion::default(); 64];
    let max = count.min(out.len());
    match c.engine.cq_read(c.id, &mut out[..max]) {
        Ok(n) => {
            for (i, e) in out[..n].iter().enumerate() {
                // SAFETY: `buf` holds `count` entries, `i < count`.
                unsafe { write_entry(c.format, buf, i, e) };
                if !src.is_null() {
                    let a =
                        c.av.map_or(flags::ADDR_UNSPEC, |av| c.engine.source_addr(av, e.source));
                    // SAFETY: `src` holds `count` addresses.
                    unsafe { *src.add(i) = a };
                }
            }
            n as isize
        }
        Err(err::EAGAIN) => {
            // Nothing yet: give the core away for a moment. An application polling in a loop
            // would otherwise hold the CPU a sleeping worker (adaptive polling, ranks sharing
            // cores) needs to run on.
            std::thread::yield_now();
            -(err::EAGAIN as isize)
        }
        Err(e) => -(e as isize),
    }
}

unsafe extern "C" fn cq_read(cq: *mut fid_cq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: forwarded.
    guard_size("fi_cq_read", || unsafe {
        cq_read_inner(cq, buf, count, null_mut())
    })
}

unsafe extern "C" fn cq_readfrom(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut fi_addr_t,
) -> isize {
    // SAFETY: forwarded.
    guard_size("fi_cq_readfrom", || unsafe {
        cq_read_inner(cq, buf, count, src)
    })
}

/// Waits up to `timeout` ms (negative: for ever) for a completion.
unsafe fn sread_inner(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut fi_addr_t,
    timeout: c_int,
) -> isize {
    let start = Instant::now();
    let limit = (timeout >= 0).then(|| Duration::from_millis(timeout as u64));
    // SAFETY: our CqObj (checked again by the read).
    let Some(c) = (unsafe { obj::<CqObj>(cq) }) else {
        return -(err::EINVAL as isize);
    };
    let (engine, id) = (c.engine.clone(), c.id);
    loop {
        // SAFETY: forwarded.
        let n = unsafe { cq_read_inner(cq, buf, count, src) };
        if n != -(err::EAGAIN as isize) {
            return n;
        }
        let left = match limit {
            Some(l) if start.elapsed() >= l => return -(err::EAGAIN as isize),
            Some(l) => l - start.elapsed(),
            None => Duration::from_millis(100),
        };
        // Until the worker publishes a completion or a tag event (its eventfd), bounded.
        engine.wait(id, left.min(Duration::from_millis(100)));
    }
}

unsafe extern "C" fn cq_sread(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: forwarded.
    guard_size("fi_cq_sread", || unsafe {
        sread_inner(cq, buf, count, null_mut(), timeout)
    })
}

unsafe extern "C" fn cq_sreadfrom(
    cq: *mut fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut fi_addr_t,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: forwarded.
    guard_size("fi_cq_sreadfrom", || unsafe {
        sread_inner(cq, buf, count, src, timeout)
    })
}

unsafe extern "C" fn cq_readerr(cq: *mut fid_cq, buf: *mut fi_cq_err_entry, _flags: u64) -> isize {
    guard_size("fi_cq_readerr", || {
        // SAFETY: our CqObj; `buf` the application's error entry.
        let Some(c) = (unsafe { obj::<CqObj>(cq) }) else {
            return -(err::EINVAL as isize);
        };
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
        let Some(out) = (unsafe { buf.as_mut() }) else {
            return -(err::EINVAL as isize);
        };
        let Some(e) = c.engine.cq_readerr(c.id) else {
            return -(err::EAGAIN as isize);
        };
        let (code, olen, prov) = e.error.unwrap_or((err::EIO, 0, 0));
        let new_api = API_VERSION.load(Ordering::Relaxed) >= info::version(1, 5);
        out.op_context = e.context as *mut c_void;
        out.flags = e.flags;
        out.len = e.len as usize;
        out.buf = e.buf as *mut c_void;
        out.data = e.data;
        out.tag = e.tag;
        out.olen = olen as usize;
        out.err = code;
        out.prov_errno = prov;
        if new_api {
            // The application's err_data buffer is left alone: no provider data.
            out.err_data_size = 0;
        } else {
            out.err_data = null_mut();
        }
        1
    })
}

unsafe extern "C" fn cq_strerror(
    _cq: *mut fid_cq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    let text: &'static CStr = match prov_errno {
        1 => c"local length error",
        2 => c"local protection error",
        3 => c"remote access error (NAK)",
        4 => c"remote invalid request (NAK)",
        5 => c"remote operational error (NAK)",
        6 => c"transport retries exceeded",
        7 => c"RNR retries exceeded",
        8 => c"flushed: the queue pair is in error",
        9 => c"local queue pair operation error",
        _ => c"no engine error",
    };
    if !buf.is_null() && len > 0 {
        let bytes = text.to_bytes();
        let n = bytes.len().min(len - 1);
        // SAFETY: `buf` holds `len` bytes; n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
        return buf;
    }
    text.as_ptr()
}

// ---- event queues (for applications that open one; no events are generated yet) ---------

static EQ_FI_OPS: fi_ops = fi_ops {
    size: size_of::<fi_ops>(),
    close: Some(eq_close),
    bind: Some(no_bind),
    control: Some(no_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static EQ_OPS: fi_ops_eq = fi_ops_eq {
    size: size_of::<fi_ops_eq>(),
    read: Some(eq_read),
    readerr: Some(eq_readerr),
    write: Some(no_eq_write),
    sread: Some(eq_sread),
    strerror: Some(eq_strerror),
};

unsafe extern "C" fn eq_open(
    fabric: *mut fid_fabric,
    _attr: *mut fi_eq_attr,
    eq: *mut *mut fid_eq,
    context: *mut c_void,
) -> c_int {
    guard_int("fi_eq_open", || {
        // SAFETY: our FabricObj.
        let Some(f) = (unsafe { obj::<FabricObj>(fabric) }) else {
            return neg(err::EINVAL);
        };
        if eq.is_null() {
            return neg(err::EINVAL);
        }
        let obj = EqObj {
            fid: fid_eq {
                fid: fid_header(FI_CLASS_EQ, context, &EQ_FI_OPS),
                ops: (&EQ_OPS as *const fi_ops_eq).cast_mut(),
            },
            engine: f.engine.clone(),
            id: f.engine.eq_open(),
            err_data: Vec::new(),
        };
        // SAFETY: checked.
        unsafe { hand_out(obj, eq) }
    })
}

id_close!(eq_close, EqObj, "fi_close(eq)", eq_close);

/// Writes `entry` into the application's buffer as an `fi_eq_cm_entry` and its data; returns
/// the bytes written.
unsafe fn write_cm_entry(
    engine: &Engine,
    entry: &crate::msg::EqEntry,
    buf: *mut c_void,
    len: usize,
) -> isize {
    let need = size_of::<fi_eq_cm_entry>() + entry.data.len();
    if len < size_of::<fi_eq_cm_entry>() {
        return -(FI_ETOOSMALL as isize);
    }
    let info = match entry.connreq {
        Some(req) => {
            // The request's description: a message endpoint's offer between the two
            // addresses, with the request as its handle.
            let offer = info::offer_type(
                None,
                info::EP_MSG,
                req.local,
                &engine.settings.dev,
                engine.settings.endpoints,
            );
            let Ok(mut offer) = offer else {
                return -(err::EINVAL as isize);
            };
            offer.dest_addr = Some(req.peer);
            let i = build_info(&offer);
            if i.is_null() {
                return -(err::ENOMEM as isize);
            }
            let handle = Box::into_raw(Box::new(ConnReqObj {
                fid: fid_header(FI_CLASS_CONNREQ, null_mut(), &CONNREQ_FI_OPS),
                id: req.id,
            }));
            // SAFETY: `i` is a fresh fi_info; the handle lives until fi_endpoint or
            // fi_reject takes it.
            unsafe { (*i).handle = handle.cast() };
            i
        }
        None => null_mut(),
    };
    let n = entry.data.len().min(len - size_of::<fi_eq_cm_entry>());
    // SAFETY: `buf` holds `len` bytes (fi_eq_read(3)); the entry and `n` data bytes fit.
    unsafe {
        let e = buf.cast::<fi_eq_cm_entry>();
        (*e).fid = entry.fid as fid_t;
        (*e).info = info;
        std::ptr::copy_nonoverlapping(
            entry.data.as_ptr(),
            buf.cast::<u8>().add(size_of::<fi_eq_cm_entry>()),
            n,
        );
    }
    (size_of::<fi_eq_cm_entry>() + n.min(need)) as isize
}

unsafe fn eq_read_inner(
    eq: *mut fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    flags: u64,
) -> isize {
    // SAFETY: our EqObj.
    let Some(e) = (unsafe { obj::<EqObj>(eq) }) else {
        return -(err::EINVAL as isize);
    };
    match e.engine.eq_read(e.id, flags & flags::PEEK != 0) {
        Ok(entry) => {
            if !event.is_null() {
                // SAFETY: the application's event word.
                unsafe { *event = entry.event };
            }
            if buf.is_null() {
                return 0;
            }
            // SAFETY: the application's buffer of `len` bytes.
            unsafe { write_cm_entry(&e.engine, &entry, buf, len) }
        }
        Err(x) => -(x as isize),
    }
}

unsafe extern "C" fn eq_read(
    eq: *mut fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    flags: u64,
) -> isize {
    // SAFETY: forwarded.
    guard_size("fi_eq_read", || unsafe {
        eq_read_inner(eq, event, buf, len, flags)
    })
}

unsafe extern "C" fn eq_readerr(eq: *mut fid_eq, buf: *mut fi_eq_err_entry, _: u64) -> isize {
    guard_size("fi_eq_readerr", || {
        // SAFETY: our EqObj; the application's error entry.
        let Some(e) = (unsafe { obj::<EqObj>(eq) }) else {
            return -(err::EINVAL as isize);
        };
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
        let Some(out) = (unsafe { buf.as_mut() }) else {
            return -(err::EINVAL as isize);
        };
        let Some(entry) = e.engine.eq_readerr(e.id) else {
            return -(err::EAGAIN as isize);
        };
        e.err_data = entry.data;
        out.fid = entry.fid as fid_t;
        out.context = null_mut();
        out.data = 0;
        out.err = entry.error.unwrap_or(err::EIO);
        out.prov_errno = 0;
        if API_VERSION.load(Ordering::Relaxed) >= info::version(1, 5)
            && out.err_data_size > 0
            && !out.err_data.is_null()
        {
            // The application gave a buffer: the peer's rejection data is copied into it.
            let n = e.err_data.len().min(out.err_data_size);
            // SAFETY: the application's err_data holds err_data_size bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(e.err_data.as_ptr(), out.err_data.cast::<u8>(), n)
            };
            out.err_data_size = n;
        } else {
            out.err_data = if e.err_data.is_empty() {
                null_mut()
            } else {
                e.err_data.as_mut_ptr().cast()
            };
            out.err_data_size = e.err_data.len();
        }
        size_of::<fi_eq_err_entry>() as isize
    })
}

unsafe extern "C" fn eq_sread(
    eq: *mut fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    timeout: c_int,
    flags: u64,
) -> isize {
    guard_size("fi_eq_sread", || {
        let start = Instant::now();
        let limit = (timeout >= 0).then(|| Duration::from_millis(timeout as u64));
        loop {
            // SAFETY: forwarded.
            let n = unsafe { eq_read_inner(eq, event, buf, len, flags) };
            if n != -(err::EAGAIN as isize) {
                return n;
            }
            if limit.is_some_and(|l| start.elapsed() >= l) {
                return n;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    })
}

static CONNREQ_FI_OPS: fi_ops = fi_ops {
    size: size_of::<fi_ops>(),
    close: Some(connreq_close),
    bind: Some(no_bind),
    control: Some(no_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

unsafe extern "C" fn connreq_close(f: *mut fid) -> c_int {
    // SAFETY: a ConnReqObj this provider made.
    unsafe { free::<ConnReqObj>(f) };
    0
}

/// The request an `info->handle` names (and frees it: each handle is taken once).
fn take_connreq(handle: fid_t) -> Option<u32> {
    // SAFETY: `handle` is null or a ConnReqObj from an FI_CONNREQ event's info.
    let r = unsafe { handle.cast::<ConnReqObj>().as_ref() }?;
    if r.fid.fclass != FI_CLASS_CONNREQ as usize {
        return None;
    }
    let id = r.id;
    // SAFETY: taken once: fi_endpoint or fi_reject consumes the request.
    unsafe { free::<ConnReqObj>(handle) };
    Some(id)
}

// ---- passive endpoints -------------------------------------------------------------------

static PEP_FI_OPS: fi_ops = fi_ops {
    size: size_of::<fi_ops>(),
    close: Some(pep_close),
    bind: Some(pep_bind),
    control: Some(no_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static PEP_OPS: fi_ops_ep = fi_ops_ep {
    size: size_of::<fi_ops_ep>(),
    cancel: Some(no_cancel),
    getopt: Some(ep_getopt),
    setopt: Some(no_setopt),
    tx_ctx: Some(no_tx_ctx),
    rx_ctx: Some(no_rx_ctx),
    rx_size_left: Some(no_size_left),
    tx_size_left: Some(no_size_left),
};

static PEP_CM_OPS: fi_ops_cm = fi_ops_cm {
    size: size_of::<fi_ops_cm>(),
    setname: Some(no_setname),
    getname: Some(pep_getname),
    getpeer: Some(no_getpeer),
    connect: Some(no_connect),
    listen: Some(pep_listen),
    accept: Some(no_accept),
    reject: Some(pep_reject),
    shutdown: Some(no_shutdown),
    join: Some(no_join),
};

unsafe extern "C" fn passive_ep(
    fabric: *mut fid_fabric,
    info: *mut fi_info,
    pep: *mut *mut fid_pep,
    context: *mut c_void,
) -> c_int {
    guard_int("fi_passive_ep", || {
        // SAFETY: our FabricObj; `info` from fi_getinfo.
        let Some(f) = (unsafe { obj::<FabricObj>(fabric) }) else {
            return neg(err::EINVAL);
        };
        if pep.is_null() {
            return neg(err::EINVAL);
        }
        // SAFETY: the fi_info from fi_getinfo: null or valid, as are its attributes.
        let port = unsafe { info.as_ref() }
            // SAFETY: the fi_info from fi_getinfo: null or valid, as are its attributes.
            .and_then(|i| unsafe { opt_bytes(i.src_addr, i.src_addrlen) })
            .as_deref()
            .and_then(EpAddr::parse)
            .map(|a| a.port)
            .filter(|&p| p != 0);
        let obj = Box::into_raw(Box::new(PepObj {
            fid: fid_pep {
                fid: fid_header(FI_CLASS_PEP, context, &PEP_FI_OPS),
                ops: (&PEP_OPS as *const fi_ops_ep).cast_mut(),
                cm: (&PEP_CM_OPS as *const fi_ops_cm).cast_mut(),
            },
            engine: f.engine.clone(),
            id: 0,
        }));
        // SAFETY: `obj` is fresh; its address names it in events.
        unsafe {
            (*obj).id = (*obj).engine.pep_open(port, obj as u64);
            *pep = obj.cast();
        }
        0
    })
}

id_close!(pep_close, PepObj, "fi_close(pep)", pep_close);

unsafe extern "C" fn pep_bind(f: *mut fid, bfid: *mut fid, _flags: u64) -> c_int {
    guard_int("fi_pep_bind", || {
        // SAFETY: our PepObj; `bfid` one of our objects.
        let Some(p) = (unsafe { obj::<PepObj>(f) }) else {
            return neg(err::EINVAL);
        };
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
        match unsafe { bfid.as_ref() }.map(|b| b.fclass as u32) {
            Some(FI_CLASS_EQ) => {
                // SAFETY: a pointer this provider handed out as that object (libfabric calls an object's ops with it).
                let Some(e) = (unsafe { obj::<EqObj>(bfid) }) else {
                    return neg(err::EINVAL);
                };
                match p.engine.pep_bind_eq(p.id, e.id) {
                    Ok(()) => 0,
                    Err(x) => neg(x),
                }
            }
            _ => neg(err::ENOSYS),
        }
    })
}

unsafe extern "C" fn pep_listen(pep: *mut fid_pep) -> c_int {
    guard_int("fi_listen", || {
        // SAFETY: our PepObj.
        let Some(p) = (unsafe { obj::<PepObj>(pep) }) else {
            return neg(err::EINVAL);
        };
        match p.engine.pep_listen(p.id) {
            Ok(()) => 0,
            Err(why) => {
                log(Level::Warn, &format!("fi_listen: {why}"));
                neg(err::EADDRINUSE)
            }
        }
    })
}

unsafe extern "C" fn pep_getname(f: fid_t, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    guard_int("fi_getname(pep)", || {
        // SAFETY: our PepObj; the application's address buffer.
        let Some(p) = (unsafe { obj::<PepObj>(f) }) else {
            return neg(err::EINVAL);
        };
        let Some(a) = p.engine.pep_name(p.id) else {
            return neg(err::EINVAL);
        };
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
        unsafe { give_name(a, addr, addrlen) }
    })
}

unsafe extern "C" fn pep_reject(
    _pep: *mut fid_pep,
    handle: fid_t,
    param: *const c_void,
    len: usize,
) -> c_int {
    guard_int("fi_reject", || {
        // SAFETY: the request's handle; `param` holds `len` bytes.
        let Some(id) = take_connreq(handle) else {
            return neg(err::EINVAL);
        };
        let Some(engine) = engine::running() else {
            return neg(err::EINVAL);
        };
        // SAFETY: `param` holds `len` bytes.
        let data = unsafe { opt_bytes(param, len) }.unwrap_or_default();
        match engine.reject(id, &data) {
            Ok(()) => 0,
            Err(x) => neg(x),
        }
    })
}

/// Copies an address out as `fi_getname` does (`-FI_ETOOSMALL` with the length needed).
unsafe fn give_name(a: EpAddr, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    // SAFETY: `addrlen` is the application's size, `addr` that many bytes.
    let Some(len) = (unsafe { addrlen.as_mut() }) else {
        return neg(err::EINVAL);
    };
    let room = *len;
    *len = addr::LEN;
    if room < addr::LEN || addr.is_null() {
        return -(FI_ETOOSMALL as c_int);
    }
    let b = a.to_bytes();
    // SAFETY: `addr` holds at least addr::LEN bytes (checked above).
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), addr.cast::<u8>(), addr::LEN) };
    0
}

unsafe extern "C" fn eq_strerror(
    _: *mut fid_eq,
    _: c_int,
    _: *const c_void,
    _: *mut c_char,
    _: usize,
) -> *const c_char {
    c"no error".as_ptr()
}

// ---- address vectors ---------------------------------------------------------------------

static AV_FI_OPS: fi_ops = fi_ops {
    size: size_of::<fi_ops>(),
    close: Some(av_close),
    bind: Some(no_bind),
    control: Some(no_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static AV_OPS: fi_ops_av = fi_ops_av {
    size: size_of::<fi_ops_av>(),
    insert: Some(av_insert),
    insertsvc: Some(no_av_insertsvc),
    insertsym: Some(no_av_insertsym),
    remove: Some(av_remove),
    lookup: Some(av_lookup),
    straddr: Some(av_straddr),
    av_set: Some(no_av_set),
};

unsafe extern "C" fn av_open(
    domain: *mut fid_domain,
    attr: *mut fi_av_attr,
    av: *mut *mut fid_av,
    context: *mut c_void,
) -> c_int {
    guard_int("fi_av_open", || {
        // SAFETY: our DomainObj; `attr` the application's.
        let Some(d) = (unsafe { obj::<DomainObj>(domain) }) else {
            return neg(err::EINVAL);
        };
        if av.is_null() {
            return neg(err::EINVAL);
        }
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
        if let Some(a) = unsafe { attr.as_ref() }
            && (!a.name.is_null() || !matches!(a.type_, 0..=2))
        {
            log(
                Level::Warn,
                "fi_av_open: named (shared) address vectors are not supported",
            );
            return neg(err::ENOSYS);
        }
        let obj = AvObj {
            fid: fid_av {
                fid: fid_header(FI_CLASS_AV, context, &AV_FI_OPS),
                ops: (&AV_OPS as *const fi_ops_av).cast_mut(),
            },
            engine: d.engine.clone(),
            id: d.engine.av_open(),
        };
        // SAFETY: checked.
        unsafe { hand_out(obj, av) }
    })
}

id_close!(av_close, AvObj, "fi_close(av)", av_close);

unsafe extern "C" fn av_insert(
    av: *mut fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut fi_addr_t,
    _flags: u64,
    _context: *mut c_void,
) -> c_int {
    guard_int("fi_av_insert", || {
        // SAFETY: our AvObj; `addr` holds `count` addresses of addr::LEN bytes.
        let Some(a) = (unsafe { obj::<AvObj>(av) }) else {
            return neg(err::EINVAL);
        };
        if addr.is_null() {
            return neg(err::EINVAL);
        }
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
        let bytes = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), count * addr::LEN) };
        let parsed: Vec<Option<EpAddr>> = bytes.chunks(addr::LEN).map(EpAddr::parse).collect();
        let out = a.engine.av_insert(a.id, &parsed);
        let mut n = 0;
        for (i, o) in out.iter().enumerate() {
            if o.is_some() {
                n += 1;
            } else {
                log(
                    Level::Warn,
                    &format!("fi_av_insert: address {i} is not a Portico address"),
                );
            }
            if !fi_addr.is_null() {
                // SAFETY: `fi_addr` holds `count` entries.
                unsafe { *fi_addr.add(i) = o.unwrap_or(flags::ADDR_UNSPEC) };
            }
        }
        n
    })
}

unsafe extern "C" fn av_remove(
    av: *mut fid_av,
    fi_addr: *mut fi_addr_t,
    count: usize,
    _flags: u64,
) -> c_int {
    guard_int("fi_av_remove", || {
        // SAFETY: our AvObj; `fi_addr` holds `count` entries.
        let Some(a) = (unsafe { obj::<AvObj>(av) }) else {
            return neg(err::EINVAL);
        };
        if fi_addr.is_null() {
            return neg(err::EINVAL);
        }
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
        let addrs = unsafe { std::slice::from_raw_parts(fi_addr, count) };
        let mut rc = 0;
        for &x in addrs {
            if !a.engine.av_remove(a.id, x) {
                rc = neg(err::EINVAL);
            }
        }
        rc
    })
}

unsafe extern "C" fn av_lookup(
    av: *mut fid_av,
    fi_addr: fi_addr_t,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    guard_int("fi_av_lookup", || {
        // SAFETY: our AvObj; `addrlen` the application's length, `addr` that many bytes.
        let Some(a) = (unsafe { obj::<AvObj>(av) }) else {
            return neg(err::EINVAL);
        };
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
        let Some(len) = (unsafe { addrlen.as_mut() }) else {
            return neg(err::EINVAL);
        };
        let Some(found) = a.engine.av_lookup(a.id, fi_addr) else {
            return neg(err::ENOENT);
        };
        let b = found.to_bytes();
        let n = (*len).min(addr::LEN);
        if !addr.is_null() {
            // SAFETY: `addr` holds `*len` bytes and `n` is no more.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), addr.cast::<u8>(), n) };
        }
        *len = addr::LEN;
        0
    })
}

unsafe extern "C" fn av_straddr(
    _av: *mut fid_av,
    addr: *const c_void,
    buf: *mut c_char,
    len: *mut usize,
) -> *const c_char {
    // SAFETY: `addr` is an address of addr::LEN bytes; `buf` holds `*len` bytes.
    let text = match unsafe { opt_bytes(addr, addr::LEN) }
        .as_deref()
        .and_then(EpAddr::parse)
    {
        Some(a) => a.to_text(),
        None => "fi_sockaddr_in://?".to_string(),
    };
    // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
    let Some(l) = (unsafe { len.as_mut() }) else {
        return null();
    };
    if !buf.is_null() && *l > 0 {
        let n = text.len().min(*l - 1);
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    *l = text.len() + 1;
    buf
}

// ---- endpoints ---------------------------------------------------------------------------

static EP_FI_OPS: fi_ops = fi_ops {
    size: size_of::<fi_ops>(),
    close: Some(ep_close),
    bind: Some(ep_bind),
    control: Some(ep_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

static EP_OPS: fi_ops_ep = fi_ops_ep {
    size: size_of::<fi_ops_ep>(),
    cancel: Some(ep_cancel),
    getopt: Some(ep_getopt),
    setopt: Some(no_setopt),
    tx_ctx: Some(no_tx_ctx),
    rx_ctx: Some(no_rx_ctx),
    rx_size_left: Some(no_size_left),
    tx_size_left: Some(no_size_left),
};

/// `fi_getopt`: `FI_OPT_CM_DATA_SIZE` (the connection data `fi_connect`/`fi_accept` carry,
/// which ofi_rxm asks before it connects); anything else is `-FI_ENOPROTOOPT`.
unsafe extern "C" fn ep_getopt(
    _fid: fid_t,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: *mut usize,
) -> c_int {
    guard_int("fi_getopt", || {
        if level as u32 != FI_OPT_ENDPOINT || optname as u32 != FI_OPT_CM_DATA_SIZE {
            return -(FI_ENOPROTOOPT as c_int);
        }
        // SAFETY: `optlen` is null or the application's length; `optval` holds that many bytes.
        let Some(len) = (unsafe { optlen.as_mut() }) else {
            return neg(err::EINVAL);
        };
        if optval.is_null() || *len < size_of::<usize>() {
            *len = size_of::<usize>();
            return -(FI_ETOOSMALL as c_int);
        }
        // SAFETY: `optval` holds at least a size_t (checked above).
        unsafe { *optval.cast::<usize>() = crate::msg::CM_DATA_MAX };
        *len = size_of::<usize>();
        0
    })
}

static CM_OPS: fi_ops_cm = fi_ops_cm {
    size: size_of::<fi_ops_cm>(),
    setname: Some(no_setname),
    getname: Some(ep_getname),
    getpeer: Some(no_getpeer),
    connect: Some(ep_connect),
    listen: Some(no_listen),
    accept: Some(ep_accept),
    reject: Some(no_reject),
    shutdown: Some(ep_shutdown),
    join: Some(no_join),
};

unsafe extern "C" fn ep_connect(
    ep: *mut fid_ep,
    addr: *const c_void,
    param: *const c_void,
    len: usize,
) -> c_int {
    guard_int("fi_connect", || {
        // SAFETY: our EpObj; `addr` an address of addr::LEN bytes; `param` `len` bytes.
        let Some(e) = (unsafe { obj::<EpObj>(ep) }) else {
            return neg(err::EINVAL);
        };
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
        let Some(dest) = unsafe { opt_bytes(addr, addr::LEN) }
            .as_deref()
            .and_then(EpAddr::parse)
        else {
            return neg(err::EINVAL);
        };
        // SAFETY: `param` holds `len` bytes (fi_connect(3), fi_accept(3), fi_reject(3)).
        let data = unsafe { opt_bytes(param, len) }.unwrap_or_default();
        match e.engine.ep_connect(e.id, dest, &data) {
            Ok(()) => 0,
            Err(x) => neg(x),
        }
    })
}

unsafe extern "C" fn ep_accept(ep: *mut fid_ep, param: *const c_void, len: usize) -> c_int {
    guard_int("fi_accept", || {
        // SAFETY: our EpObj; `param` holds `len` bytes.
        let Some(e) = (unsafe { obj::<EpObj>(ep) }) else {
            return neg(err::EINVAL);
        };
        // SAFETY: `param` holds `len` bytes.
        let data = unsafe { opt_bytes(param, len) }.unwrap_or_default();
        match e.engine.ep_accept(e.id, &data) {
            Ok(()) => 0,
            Err(x) => neg(x),
        }
    })
}

unsafe extern "C" fn ep_shutdown(ep: *mut fid_ep, _flags: u64) -> c_int {
    guard_int("fi_shutdown", || {
        // SAFETY: our EpObj.
        let Some(e) = (unsafe { obj::<EpObj>(ep) }) else {
            return neg(err::EINVAL);
        };
        match e.engine.ep_shutdown(e.id) {
            Ok(()) => 0,
            Err(x) => neg(x),
        }
    })
}

static MSG_OPS: fi_ops_msg = fi_ops_msg {
    size: size_of::<fi_ops_msg>(),
    recv: Some(msg_recv),
    recvv: Some(msg_recvv),
    recvmsg: Some(msg_recvmsg),
    send: Some(msg_send),
    sendv: Some(msg_sendv),
    sendmsg: Some(msg_sendmsg),
    inject: Some(msg_inject),
    senddata: Some(msg_senddata),
    injectdata: Some(msg_injectdata),
};

static TAGGED_OPS: fi_ops_tagged = fi_ops_tagged {
    size: size_of::<fi_ops_tagged>(),
    recv: Some(t_recv),
    recvv: Some(t_recvv),
    recvmsg: Some(t_recvmsg),
    send: Some(t_send),
    sendv: Some(t_sendv),
    sendmsg: Some(t_sendmsg),
    inject: Some(t_inject),
    senddata: Some(t_senddata),
    injectdata: Some(t_injectdata),
};

static RMA_OPS: fi_ops_rma = fi_ops_rma {
    size: size_of::<fi_ops_rma>(),
    read: Some(rma_read),
    readv: Some(rma_readv),
    readmsg: Some(rma_readmsg),
    write: Some(rma_write),
    writev: Some(rma_writev),
    writemsg: Some(rma_writemsg),
    inject: Some(rma_inject),
    writedata: Some(rma_writedata),
    injectdata: Some(rma_injectdata),
};

static ATOMIC_OPS: fi_ops_atomic = fi_ops_atomic {
    size: size_of::<fi_ops_atomic>(),
    write: Some(no_atomic_write),
    writev: Some(no_atomic_writev),
    writemsg: Some(no_atomic_writemsg),
    inject: Some(no_atomic_inject),
    readwrite: Some(no_atomic_readwrite),
    readwritev: Some(no_atomic_readwritev),
    readwritemsg: Some(no_atomic_readwritemsg),
    compwrite: Some(no_atomic_compwrite),
    compwritev: Some(no_atomic_compwritev),
    compwritemsg: Some(no_atomic_compwritemsg),
    writevalid: Some(no_atomic_valid),
    readwritevalid: Some(no_atomic_valid),
    compwritevalid: Some(no_atomic_valid),
};

unsafe extern "C" fn ep_open(
    domain: *mut fid_domain,
    info: *mut fi_info,
    ep: *mut *mut fid_ep,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { ep_open2(domain, info, ep, 0, context) }
}

unsafe extern "C" fn ep_open2(
    domain: *mut fid_domain,
    info: *mut fi_info,
    ep: *mut *mut fid_ep,
    _flags: u64,
    context: *mut c_void,
) -> c_int {
    guard_int("fi_endpoint", || {
        // SAFETY: our DomainObj; `info` the fi_info from fi_getinfo.
        let Some(d) = (unsafe { obj::<DomainObj>(domain) }) else {
            return neg(err::EINVAL);
        };
        if ep.is_null() {
            return neg(err::EINVAL);
        }
        let (mut tx_flags, mut rx_flags, mut directed, mut msg) = (0, 0, false, false);
        let mut connreq = None;
        let mut tclass = crate::tclass::UNSPEC;
        // SAFETY: the fi_info from fi_getinfo: null or valid, as are its attributes.
        if let Some(i) = unsafe { info.as_ref() } {
            directed = i.caps & flags::DIRECTED_RECV != 0;
            // SAFETY: the fi_info from fi_getinfo: null or valid, as are its attributes.
            if let Some(e) = unsafe { i.ep_attr.as_ref() } {
                match e.type_ {
                    info::EP_RDM | info::EP_UNSPEC => {}
                    info::EP_MSG => msg = true,
                    _ => return neg(err::ENOSYS),
                }
            }
            if msg && !i.handle.is_null() {
                // An endpoint for a connection request (the FI_CONNREQ event's info).
                match take_connreq(i.handle) {
                    Some(id) => {
                        connreq = Some(id);
                        // SAFETY: the application's fi_info: the handle is taken.
                        unsafe { (*info).handle = null_mut() };
                    }
                    None => return neg(err::EINVAL),
                }
            }
            // SAFETY: the fi_info from fi_getinfo: null or valid, as are its attributes.
            if let Some(tx) = unsafe { i.tx_attr.as_ref() } {
                tx_flags = tx.op_flags;
                tclass = tx.tclass;
            }
            // SAFETY: the fi_info from fi_getinfo: null or valid, as are its attributes.
            if let (crate::tclass::UNSPEC, Some(d)) = (tclass, unsafe { i.domain_attr.as_ref() }) {
                tclass = d.tclass;
            }
            if !crate::tclass::valid(tclass) {
                log(
                    Level::Warn,
                    &format!("fi_endpoint: tclass {tclass:#x} is not a class libfabric defines"),
                );
                return neg(err::EINVAL);
            }
            // SAFETY: the fi_info from fi_getinfo: null or valid, as are its attributes.
            if let Some(rx) = unsafe { i.rx_attr.as_ref() } {
                rx_flags = rx.op_flags;
                directed |= rx.caps & flags::DIRECTED_RECV != 0;
            }
        }
        let id = if msg {
            Some(d.engine.msg_ep_open(tx_flags, rx_flags, connreq))
        } else {
            d.engine.ep_open(tx_flags, rx_flags, directed, tclass)
        };
        let Some(id) = id else {
            log(
                Level::Warn,
                "fi_endpoint: every endpoint FI_PORTICO_ENDPOINTS allows is open",
            );
            return neg(err::EBUSY);
        };
        let obj = EpObj {
            fid: fid_ep {
                fid: fid_header(FI_CLASS_EP, context, &EP_FI_OPS),
                ops: (&EP_OPS as *const fi_ops_ep).cast_mut(),
                cm: (&CM_OPS as *const fi_ops_cm).cast_mut(),
                msg: (&MSG_OPS as *const fi_ops_msg).cast_mut(),
                rma: (&RMA_OPS as *const fi_ops_rma).cast_mut(),
                tagged: (&TAGGED_OPS as *const fi_ops_tagged).cast_mut(),
                atomic: (&ATOMIC_OPS as *const fi_ops_atomic).cast_mut(),
                collective: null_mut(),
            },
            engine: d.engine.clone(),
            id,
        };
        let engine = d.engine.clone();
        // SAFETY: checked.
        let rc = unsafe { hand_out(obj, ep) };
        // SAFETY: hand_out stored the object's address in `*ep`.
        engine.ep_set_fid(id, unsafe { *ep } as u64);
        rc
    })
}

id_close!(ep_close, EpObj, "fi_close(ep)", ep_close);

unsafe extern "C" fn ep_bind(f: *mut fid, bfid: *mut fid, flags: u64) -> c_int {
    guard_int("fi_ep_bind", || {
        // SAFETY: our EpObj; `bfid` one of our objects, told apart by its class.
        let Some(e) = (unsafe { obj::<EpObj>(f) }) else {
            return neg(err::EINVAL);
        };
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
        let Some(b) = (unsafe { bfid.as_ref() }) else {
            return neg(err::EINVAL);
        };
        let r = match b.fclass as u32 {
            FI_CLASS_CQ => {
                // SAFETY: `bfid` is this provider's object of the class matched above.
                let Some(c) = (unsafe { obj::<CqObj>(bfid) }) else {
                    return neg(err::EINVAL);
                };
                let r = e.engine.ep_bind_cq(e.id, c.id, flags);
                if r.is_ok() {
                    c.av = e
                        .engine
                        .lock()
                        .eps
                        .get(e.id)
                        .and_then(|x| x.as_ref())
                        .and_then(|x| x.av);
                }
                r
            }
            FI_CLASS_AV => {
                // SAFETY: `bfid` is this provider's object of the class matched above.
                let Some(a) = (unsafe { obj::<AvObj>(bfid) }) else {
                    return neg(err::EINVAL);
                };
                e.engine.ep_bind_av(e.id, a.id)
            }
            // A message endpoint's connection events; an RDM endpoint has none to carry.
            FI_CLASS_EQ => {
                // SAFETY: `bfid` is this provider's object of the class matched above.
                let Some(q) = (unsafe { obj::<EqObj>(bfid) }) else {
                    return neg(err::EINVAL);
                };
                e.engine.ep_bind_eq(e.id, q.id)
            }
            _ => Err(err::ENOSYS),
        };
        match r {
            Ok(()) => 0,
            Err(x) => neg(x),
        }
    })
}

unsafe extern "C" fn ep_cancel(f: fid_t, context: *mut c_void) -> isize {
    guard_size("fi_cancel", || {
        // SAFETY: our EpObj (fi_cancel is an endpoint's op).
        let Some(e) = (unsafe { obj::<EpObj>(f) }) else {
            return -(err::EINVAL as isize);
        };
        match e.engine.cancel(e.id, context as u64) {
            Ok(()) => 0,
            Err(x) => -(x as isize),
        }
    })
}

unsafe extern "C" fn ep_control(f: *mut fid, command: c_int, arg: *mut c_void) -> c_int {
    guard_int("fi_control(ep)", || {
        // SAFETY: our EpObj.
        let Some(e) = (unsafe { obj::<EpObj>(f) }) else {
            return neg(err::EINVAL);
        };
        match command as u32 {
            FI_ENABLE => match e.engine.ep_enable(e.id) {
                Ok(()) => 0,
                Err(why) => {
                    log(Level::Warn, &format!("fi_enable: {why}"));
                    neg(err::EINVAL)
                }
            },
            FI_GETOPSFLAG | FI_SETOPSFLAG => {
                // SAFETY: `arg` points at a u64 of flags (fi_control(3)).
                let Some(v) = (unsafe { arg.cast::<u64>().as_mut() }) else {
                    return neg(err::EINVAL);
                };
                let mut st = e.engine.lock();
                let Some(Some(ep)) = st.eps.get_mut(e.id) else {
                    return neg(err::EINVAL);
                };
                let tx = *v & flags::TRANSMIT != 0;
                let target = if tx {
                    &mut ep.tx_op_flags
                } else {
                    &mut ep.rx_op_flags
                };
                if command as u32 == FI_GETOPSFLAG {
                    *v = *target;
                } else {
                    *target = *v & !(flags::TRANSMIT | flags::RECV);
                }
                0
            }
            _ => neg(err::ENOSYS),
        }
    })
}

unsafe extern "C" fn ep_getname(f: fid_t, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    guard_int("fi_getname", || {
        // SAFETY: our EpObj.
        let Some(e) = (unsafe { obj::<EpObj>(f) }) else {
            return neg(err::EINVAL);
        };
        let name = match e.engine.lock().eps.get(e.id).and_then(|x| x.as_ref()) {
            Some(x) if x.msg => e.engine.msg_name(),
            Some(x) => e.engine.ep_addr(x.index),
            None => return neg(err::EINVAL),
        };
        // SAFETY: forwarded from the application's call.
        unsafe { give_name(name, addr, addrlen) }
    })
}

// ---- data transfer -----------------------------------------------------------------------

/// One iovec's base and length, with its descriptor's lkey.
unsafe fn one_iov(
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
) -> Result<(u64, usize, Option<u32>), i32> {
    if count > 1 {
        return Err(err::ENOSYS);
    }
    if count == 0 || iov.is_null() {
        return Ok((0, 0, None));
    }
    // SAFETY: `iov` holds `count` iovecs; `desc` is null or holds `count` descriptors.
    let v = unsafe { *iov };
    let d = if desc.is_null() {
        null_mut()
    } else {
        // SAFETY: a pointer from the application or libfabric, valid as the call's man page says (checked for null where it may be).
        unsafe { *desc }
    };
    Ok((v.iov_base as u64, v.iov_len, desc_lkey(d)))
}

/// An operation's iovecs (at most [`engine::MAX_IOV`], the offer's `tx_attr.iov_limit`), with
/// their descriptors' lkeys.
unsafe fn iovs(iov: *const iovec, desc: *mut *mut c_void, count: usize) -> Result<Iov, i32> {
    if count > engine::MAX_IOV {
        return Err(err::EINVAL);
    }
    let mut io = Iov::default();
    if count == 0 || iov.is_null() {
        return Ok(Iov::one(0, 0, None));
    }
    for i in 0..count {
        // SAFETY: `iov` holds `count` iovecs; `desc` is null or holds `count` descriptors.
        let (v, d) = unsafe {
            let v = *iov.add(i);
            let d = if desc.is_null() {
                null_mut()
            } else {
                *desc.add(i)
            };
            (v, d)
        };
        io.push(Piece {
            addr: v.iov_base as u64,
            len: v.iov_len,
            lkey: desc_lkey(d),
        });
    }
    Ok(io)
}

/// The bytes an inject copies: every piece of `io`, gathered into `out` (at most
/// [`info::INJECT_SIZE`]); how many.
fn gather_inline(io: &Iov, out: &mut [u8; info::INJECT_SIZE]) -> Result<usize, i32> {
    let total = io.total();
    if total > info::INJECT_SIZE {
        return Err(err::EMSGSIZE);
    }
    let mut at = 0;
    for p in io.pieces() {
        if p.len == 0 {
            continue;
        }
        if p.addr == 0 {
            return Err(err::EINVAL);
        }
        // SAFETY: the application's `len` bytes at `addr` (fi_inject(3), fi_sendmsg with
        // FI_INJECT: the buffer is the application's again when the call returns), copied now.
        let src = unsafe { std::slice::from_raw_parts(p.addr as *const u8, p.len) };
        out[at..at + p.len].copy_from_slice(src);
        at += p.len;
    }
    Ok(total)
}

/// An operation's refusal: `-FI_EAGAIN` silently (the application retries), anything else
/// with a log line.
fn refused(what: &str, e: i32) -> isize {
    if e != err::EAGAIN {
        log(
            Level::Warn,
            &format!("{what} refused: {} ({})", fi_text(e), -e),
        );
    }
    -(e as isize)
}

/// libfabric's text for an error number.
fn fi_text(e: i32) -> String {
    // SAFETY: fi_strerror returns a pointer to a static NUL-terminated string.
    unsafe { CStr::from_ptr(fi_strerror(e)) }
        .to_string_lossy()
        .into_owned()
}

/// Every send of the ops tables goes here.
#[allow(clippy::too_many_arguments)]
fn send(
    ep: *mut fid_ep,
    io: Iov,
    dest: u64,
    tag: u64,
    data: Option<u64>,
    context: *mut c_void,
    flags: u64,
    inject: bool,
) -> isize {
    guard_size("send", || {
        // SAFETY: our EpObj.
        let Some(e) = (unsafe { obj::<EpObj>(ep) }) else {
            return -(err::EINVAL as isize);
        };
        let mut bytes = [0u8; info::INJECT_SIZE];
        let inline = if inject {
            match gather_inline(&io, &mut bytes) {
                Ok(n) => Some(&bytes[..n]),
                Err(x) => return -(x as isize),
            }
        } else {
            None
        };
        match e
            .engine
            .send(e.id, &io, dest, tag, data, context as u64, flags, inline)
        {
            Ok(()) => 0,
            Err(x) => refused("send", x),
        }
    })
}

#[allow(clippy::too_many_arguments)]
fn recv(
    ep: *mut fid_ep,
    buf: u64,
    len: usize,
    lkey: Option<u32>,
    src: u64,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
    flags: u64,
) -> isize {
    guard_size("recv", || {
        // SAFETY: our EpObj.
        let Some(e) = (unsafe { obj::<EpObj>(ep) }) else {
            return -(err::EINVAL as isize);
        };
        match e.engine.recv(
            e.id,
            buf,
            len,
            lkey,
            src,
            tag,
            ignore,
            context as u64,
            flags,
        ) {
            Ok(()) => 0,
            Err(x) => refused("receive", x),
        }
    })
}

unsafe extern "C" fn msg_recv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src: fi_addr_t,
    context: *mut c_void,
) -> isize {
    recv(ep, buf as u64, len, desc_lkey(desc), src, 0, 0, context, 0)
}

unsafe extern "C" fn msg_recvv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    src: fi_addr_t,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's iovecs.
    match unsafe { one_iov(iov, desc, count) } {
        Ok((b, l, k)) => recv(ep, b, l, k, src, 0, 0, context, 0),
        Err(e) => -(e as isize),
    }
}

unsafe extern "C" fn msg_recvmsg(ep: *mut fid_ep, msg: *const fi_msg, flags: u64) -> isize {
    // SAFETY: the application's message.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(err::EINVAL as isize);
    };
    // SAFETY: the application's message: its iovecs and descriptors are as many as it says.
    match unsafe { one_iov(m.msg_iov, m.desc, m.iov_count) } {
        Ok((b, l, k)) => recv(ep, b, l, k, m.addr, 0, 0, m.context, flags),
        Err(e) => -(e as isize),
    }
}

unsafe extern "C" fn msg_send(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest: fi_addr_t,
    context: *mut c_void,
) -> isize {
    send(
        ep,
        Iov::one(buf as u64, len, desc_lkey(desc)),
        dest,
        0,
        None,
        context,
        0,
        false,
    )
}

unsafe extern "C" fn msg_sendv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    dest: fi_addr_t,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's iovecs.
    match unsafe { iovs(iov, desc, count) } {
        Ok(io) => send(ep, io, dest, 0, None, context, 0, false),
        Err(e) => -(e as isize),
    }
}

unsafe extern "C" fn msg_sendmsg(ep: *mut fid_ep, msg: *const fi_msg, flags: u64) -> isize {
    // SAFETY: the application's message.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(err::EINVAL as isize);
    };
    let data = (flags & flags::REMOTE_CQ_DATA != 0).then_some(m.data);
    // SAFETY: the application's message: its iovecs and descriptors are as many as it says.
    match unsafe { iovs(m.msg_iov, m.desc, m.iov_count) } {
        Ok(io) => send(
            ep,
            io,
            m.addr,
            0,
            data,
            m.context,
            flags,
            flags & flags::INJECT != 0,
        ),
        Err(e) => -(e as isize),
    }
}

unsafe extern "C" fn msg_inject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: fi_addr_t,
) -> isize {
    send(
        ep,
        Iov::one(buf as u64, len, None),
        dest,
        0,
        None,
        null_mut(),
        0,
        true,
    )
}

unsafe extern "C" fn msg_senddata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    data: u64,
    dest: fi_addr_t,
    context: *mut c_void,
) -> isize {
    send(
        ep,
        Iov::one(buf as u64, len, desc_lkey(desc)),
        dest,
        0,
        Some(data),
        context,
        0,
        false,
    )
}

unsafe extern "C" fn msg_injectdata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: fi_addr_t,
) -> isize {
    send(
        ep,
        Iov::one(buf as u64, len, None),
        dest,
        0,
        Some(data),
        null_mut(),
        0,
        true,
    )
}

unsafe extern "C" fn t_recv(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src: fi_addr_t,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    recv(
        ep,
        buf as u64,
        len,
        desc_lkey(desc),
        src,
        tag,
        ignore,
        context,
        flags::TAGGED,
    )
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn t_recvv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    src: fi_addr_t,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's iovecs.
    match unsafe { one_iov(iov, desc, count) } {
        Ok((b, l, k)) => recv(ep, b, l, k, src, tag, ignore, context, flags::TAGGED),
        Err(e) => -(e as isize),
    }
}

unsafe extern "C" fn t_recvmsg(ep: *mut fid_ep, msg: *const fi_msg_tagged, flags: u64) -> isize {
    // SAFETY: the application's message.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(err::EINVAL as isize);
    };
    // FI_PEEK, FI_CLAIM and FI_DISCARD go with the flags (engine::Engine::recv).
    // SAFETY: the application's message: its iovecs and descriptors are as many as it says.
    match unsafe { one_iov(m.msg_iov, m.desc, m.iov_count) } {
        Ok((b, l, k)) => recv(
            ep,
            b,
            l,
            k,
            m.addr,
            m.tag,
            m.ignore,
            m.context,
            flags | flags::TAGGED,
        ),
        Err(e) => -(e as isize),
    }
}

unsafe extern "C" fn t_send(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest: fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    send(
        ep,
        Iov::one(buf as u64, len, desc_lkey(desc)),
        dest,
        tag,
        None,
        context,
        flags::TAGGED,
        false,
    )
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn t_sendv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    dest: fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's iovecs.
    match unsafe { iovs(iov, desc, count) } {
        Ok(io) => send(ep, io, dest, tag, None, context, flags::TAGGED, false),
        Err(e) => -(e as isize),
    }
}

unsafe extern "C" fn t_sendmsg(ep: *mut fid_ep, msg: *const fi_msg_tagged, flags: u64) -> isize {
    // SAFETY: the application's message.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(err::EINVAL as isize);
    };
    let data = (flags & flags::REMOTE_CQ_DATA != 0).then_some(m.data);
    // SAFETY: the application's message: its iovecs and descriptors are as many as it says.
    match unsafe { iovs(m.msg_iov, m.desc, m.iov_count) } {
        Ok(io) => send(
            ep,
            io,
            m.addr,
            m.tag,
            data,
            m.context,
            flags | flags::TAGGED,
            flags & flags::INJECT != 0,
        ),
        Err(e) => -(e as isize),
    }
}

unsafe extern "C" fn t_inject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: fi_addr_t,
    tag: u64,
) -> isize {
    send(
        ep,
        Iov::one(buf as u64, len, None),
        dest,
        tag,
        None,
        null_mut(),
        flags::TAGGED,
        true,
    )
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn t_senddata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    data: u64,
    dest: fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    send(
        ep,
        Iov::one(buf as u64, len, desc_lkey(desc)),
        dest,
        tag,
        Some(data),
        context,
        flags::TAGGED,
        false,
    )
}

unsafe extern "C" fn t_injectdata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: fi_addr_t,
    tag: u64,
) -> isize {
    send(
        ep,
        Iov::one(buf as u64, len, None),
        dest,
        tag,
        Some(data),
        null_mut(),
        flags::TAGGED,
        true,
    )
}

// ---- RMA ---------------------------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
fn rma(
    ep: *mut fid_ep,
    read: bool,
    io: Iov,
    dest: u64,
    addr: u64,
    key: u64,
    data: Option<u64>,
    context: *mut c_void,
    flags: u64,
    inject: bool,
) -> isize {
    let name = match (read, data.is_some()) {
        (true, _) => "fi_read",
        (false, false) => "fi_write",
        (false, true) => "fi_writedata",
    };
    guard_size(name, || {
        // SAFETY: our EpObj.
        let Some(e) = (unsafe { obj::<EpObj>(ep) }) else {
            return -(err::EINVAL as isize);
        };
        let mut bytes = [0u8; info::INJECT_SIZE];
        let inline = if inject {
            match gather_inline(&io, &mut bytes) {
                Ok(n) => Some(&bytes[..n]),
                Err(x) => return -(x as isize),
            }
        } else {
            None
        };
        match e.engine.rma(
            e.id,
            read,
            &io,
            dest,
            addr,
            key,
            data,
            context as u64,
            flags,
            inline,
        ) {
            Ok(()) => 0,
            Err(x) => refused(name, x),
        }
    })
}

/// One RMA iovec of a message.
unsafe fn one_rma_iov(iov: *const fi_rma_iov, count: usize) -> Result<(u64, u64), i32> {
    if count != 1 || iov.is_null() {
        return Err(if count > 1 { err::ENOSYS } else { err::EINVAL });
    }
    // SAFETY: `iov` holds `count` (one) entries.
    let r = unsafe { *iov };
    Ok((r.addr, r.key))
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_read(
    ep: *mut fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    rma(
        ep,
        true,
        Iov::one(buf as u64, len, desc_lkey(desc)),
        src,
        addr,
        key,
        None,
        context,
        0,
        false,
    )
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_readv(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    src: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's iovecs.
    match unsafe { iovs(iov, desc, count) } {
        Ok(io) => rma(ep, true, io, src, addr, key, None, context, 0, false),
        Err(e) => -(e as isize),
    }
}

unsafe extern "C" fn rma_readmsg(ep: *mut fid_ep, msg: *const fi_msg_rma, flags: u64) -> isize {
    // SAFETY: the application's message.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(err::EINVAL as isize);
    };
    // SAFETY: the application's message: its iovecs and descriptors are as many as it says.
    let (addr, key) = match unsafe { one_rma_iov(m.rma_iov, m.rma_iov_count) } {
        Ok(x) => x,
        Err(e) => return -(e as isize),
    };
    // SAFETY: the application's message: its iovecs and descriptors are as many as it says.
    match unsafe { iovs(m.msg_iov, m.desc, m.iov_count) } {
        Ok(io) => rma(
            ep, true, io, m.addr, addr, key, None, m.context, flags, false,
        ),
        Err(e) => -(e as isize),
    }
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_write(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    rma(
        ep,
        false,
        Iov::one(buf as u64, len, desc_lkey(desc)),
        dest,
        addr,
        key,
        None,
        context,
        0,
        false,
    )
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_writev(
    ep: *mut fid_ep,
    iov: *const iovec,
    desc: *mut *mut c_void,
    count: usize,
    dest: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    // SAFETY: the application's iovecs.
    match unsafe { iovs(iov, desc, count) } {
        Ok(io) => rma(ep, false, io, dest, addr, key, None, context, 0, false),
        Err(e) => -(e as isize),
    }
}

unsafe extern "C" fn rma_writemsg(ep: *mut fid_ep, msg: *const fi_msg_rma, flags: u64) -> isize {
    // SAFETY: the application's message.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(err::EINVAL as isize);
    };
    let data = (flags & flags::REMOTE_CQ_DATA != 0).then_some(m.data);
    // SAFETY: the application's message: its iovecs and descriptors are as many as it says.
    let (addr, key) = match unsafe { one_rma_iov(m.rma_iov, m.rma_iov_count) } {
        Ok(x) => x,
        Err(e) => return -(e as isize),
    };
    // SAFETY: the application's message: its iovecs and descriptors are as many as it says.
    match unsafe { iovs(m.msg_iov, m.desc, m.iov_count) } {
        Ok(io) => rma(
            ep,
            false,
            io,
            m.addr,
            addr,
            key,
            data,
            m.context,
            flags,
            flags & flags::INJECT != 0,
        ),
        Err(e) => -(e as isize),
    }
}

unsafe extern "C" fn rma_inject(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    dest: fi_addr_t,
    addr: u64,
    key: u64,
) -> isize {
    rma(
        ep,
        false,
        Iov::one(buf as u64, len, None),
        dest,
        addr,
        key,
        None,
        null_mut(),
        0,
        true,
    )
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn rma_writedata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    data: u64,
    dest: fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    rma(
        ep,
        false,
        Iov::one(buf as u64, len, desc_lkey(desc)),
        dest,
        addr,
        key,
        Some(data),
        context,
        0,
        false,
    )
}

unsafe extern "C" fn rma_injectdata(
    ep: *mut fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: fi_addr_t,
    addr: u64,
    key: u64,
) -> isize {
    rma(
        ep,
        false,
        Iov::one(buf as u64, len, None),
        dest,
        addr,
        key,
        Some(data),
        null_mut(),
        0,
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_never_crosses_the_boundary() {
        assert_eq!(guard_int("test", || panic!("boom")), -(FI_EOTHER as c_int));
        assert_eq!(guard_size("test", || panic!("boom")), -(FI_EOTHER as isize));
        assert_eq!(guard_int("test", || 7), 7);
    }

    #[test]
    fn null_arguments_are_refused_not_dereferenced() {
        // SAFETY: every pointer is null, which each entry point checks first.
        unsafe {
            assert_eq!(
                getinfo(0, null(), null(), 0, null(), null_mut()),
                -(err::EINVAL)
            );
            assert_eq!(cq_read(null_mut(), null_mut(), 1), -(err::EINVAL as isize));
            assert_eq!(
                av_insert(null_mut(), null(), 0, null_mut(), 0, null_mut()),
                -(err::EINVAL)
            );
            assert_eq!(
                ep_getname(null_mut(), null_mut(), null_mut()),
                -(err::EINVAL)
            );
            assert_eq!(
                msg_send(null_mut(), null(), 0, null_mut(), 0, null_mut()),
                -(err::EINVAL as isize)
            );
        }
    }
}
