//! DPDK telemetry commands answered in Rust, and a client for the telemetry socket.
//!
//! EAL starts DPDK's telemetry during `rte_eal_init` (unless `--no-telemetry`): a thread that
//! serves `<runtime dir>/dpdk_telemetry.v2`, a `SOCK_SEQPACKET` Unix socket where a client
//! sends `/command,params` and reads one JSON answer, `{"/command": ...}`. [`register`] adds a
//! command whose answer is a Rust closure's `serde_json::Value`; the closure gets the text
//! after the first comma (`""` without one). DPDK's callback carries no user pointer, so the
//! closures live in a process-wide registry keyed by command name, and one `extern "C"`
//! trampoline looks the command up by the name DPDK passes it. DPDK 22.11 cannot remove a
//! command: dropping the [`Command`] handle makes the command answer
//! `{"stopped": 1, "reason": ...}` from then on (it never calls into freed state), and a later
//! [`register`] of the same name serves it again.
//!
//! What DPDK 22.11 can carry (read from `rte_telemetry.h` and checked against Debian's
//! 22.11.11 on this machine), and what the conversion does with a `Value` ([`to_tel`]):
//! - Dicts nest to any depth and may hold arrays of scalars. Arrays hold only scalars of one
//!   type (u64, 32-bit int or string); an array of arrays or of dicts is refused by DPDK. So an
//!   array with any object or array in it becomes a dict keyed by index (`"0"`, `"1"`, ...).
//! - Numbers: u64 as u64; negative integers that fit 32 bits as int; other negative integers
//!   and every float as a string of their JSON text (22.11 has no double and no i64). Mixed
//!   arrays take the widest of u64, int, string. Booleans are int 0/1, null the string `null`.
//! - Keys may only hold `[A-Za-z0-9_/]` and at most 127 bytes: any other key fails the whole
//!   answer with an error (DPDK would refuse it; a command's own keys are fixed, so this is a
//!   bug to see, not data to bend).
//! - Strings hold at most 127 bytes: a longer one is cut at a character boundary and ends in
//!   `...` (DPDK would cut it without a mark). Control characters become `?`.
//! - At most 256 entries per dict and 512 per array, and at most 16384 bytes of JSON per
//!   answer. DPDK would drop what does not fit without a word (an answer over 16 KiB is cut
//!   after the last entry that fits), so an answer over any limit is replaced whole by
//!   `{"error": "..."}` saying which limit.
//!
//! Errors are answered as `{"error": "<why>"}`, not with DPDK's bare `null` (a negative
//! return), so that a client sees why. A closure that panics is answered the same way; no
//! panic crosses into C.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use dpdk_sys::rte_tel_data;
use serde_json::{Value, json};

use super::{DpdkError, Eal, c_string};

/// Longest command name DPDK 22.11 takes (`MAX_CMD_LEN` is 56, with the NUL).
pub const MAX_COMMAND_LEN: usize = 55;
/// Longest key, string value and help text, in bytes (`RTE_TEL_MAX_STRING_LEN`, with the NUL).
pub const MAX_STRING_LEN: usize = dpdk_sys::RTE_TEL_MAX_STRING_LEN as usize - 1;
/// Longest answer that is a single string (`RTE_TEL_MAX_SINGLE_STRING_LEN`, with the NUL).
pub const MAX_SINGLE_STRING_LEN: usize = dpdk_sys::RTE_TEL_MAX_SINGLE_STRING_LEN as usize - 1;
/// Entries of a dict, of an array (`RTE_TEL_MAX_DICT_ENTRIES`, `RTE_TEL_MAX_ARRAY_ENTRIES`).
pub const MAX_DICT_ENTRIES: usize = dpdk_sys::RTE_TEL_MAX_DICT_ENTRIES as usize;
pub const MAX_ARRAY_ENTRIES: usize = dpdk_sys::RTE_TEL_MAX_ARRAY_ENTRIES as usize;
/// Bytes of JSON one answer may take, `{"/command": ...}` included (the `max_output_len` the
/// socket announces).
pub const MAX_OUTPUT_LEN: usize = 16384;

/// Why a command could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("telemetry command {0:?}: EAL is not running (telemetry starts with EAL)")]
    NotStarted(String),
    #[error(
        "telemetry command {0:?}: a name starts with '/', holds only A-Z a-z 0-9 _ / and at most {MAX_COMMAND_LEN} bytes"
    )]
    BadName(String),
    #[error("telemetry command {0:?}: the help text is over {MAX_STRING_LEN} bytes")]
    BadHelp(String),
    #[error("telemetry command {0:?} is already registered and served")]
    AlreadyRegistered(String),
    #[error(transparent)]
    Dpdk(#[from] DpdkError),
}

type Handler = Box<dyn Fn(&str) -> Value + Send + Sync>;

/// The process's commands: a handler while served, `None` once its [`Command`] was dropped
/// (DPDK still lists the name).
fn registry() -> MutexGuard<'static, HashMap<String, Option<Handler>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Option<Handler>>>> = OnceLock::new();
    REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// A served command. Dropping it stops serving: the command answers `{"stopped": 1, ...}`.
#[derive(Debug)]
pub struct Command {
    name: String,
}

impl Command {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Command {
    fn drop(&mut self) {
        // Waits for an answer in progress: after this, the handler is never called again.
        if let Some(slot) = registry().get_mut(&self.name) {
            *slot = None;
        }
    }
}

/// Whether `name` is a command name DPDK 22.11 takes.
pub fn valid_command_name(name: &str) -> bool {
    name.starts_with('/')
        && name.len() <= MAX_COMMAND_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'/')
}

/// Registers `name` (e.g. `/portico/workers`) with DPDK telemetry, answered by `handler`,
/// which gets the command's parameters. Requires EAL. The handler runs on DPDK's telemetry
/// thread, one answer at a time across all commands; it must not register commands.
pub fn register(
    name: &str,
    help: &str,
    handler: impl Fn(&str) -> Value + Send + Sync + 'static,
) -> Result<Command, TelemetryError> {
    if !valid_command_name(name) {
        return Err(TelemetryError::BadName(name.into()));
    }
    if help.len() > MAX_STRING_LEN {
        return Err(TelemetryError::BadHelp(name.into()));
    }
    if Eal::get().is_none() {
        return Err(TelemetryError::NotStarted(name.into()));
    }
    let c_name = c_string("telemetry command", name)?;
    let c_help = c_string("telemetry help", help)?;
    let known = {
        let mut reg = registry();
        match reg.get_mut(name) {
            Some(Some(_)) => return Err(TelemetryError::AlreadyRegistered(name.into())),
            Some(slot) => {
                *slot = Some(Box::new(handler));
                true
            }
            None => {
                reg.insert(name.into(), Some(Box::new(handler)));
                false
            }
        }
    };
    if !known {
        // Outside the registry's lock: DPDK takes its own lock here, and its thread may be
        // waiting for the registry in the trampoline.
        // SAFETY: both strings are NUL-terminated and outlive the call (DPDK copies them);
        // the trampoline is a valid `telemetry_cb` for the life of the process.
        let rc = unsafe {
            dpdk_sys::rte_telemetry_register_cmd(c_name.as_ptr(), Some(trampoline), c_help.as_ptr())
        };
        if rc != 0 {
            registry().remove(name);
            return Err(
                DpdkError::from_code(format!("registering telemetry command {name}"), rc).into(),
            );
        }
    }
    Ok(Command { name: name.into() })
}

/// The socket a telemetry client connects to, when EAL runs with telemetry. A second process
/// with the same runtime directory gets `dpdk_telemetry.v2:1` instead (DPDK's instances);
/// Portico's defaults (`--in-memory`/`--no-shconf`) share the directory `rte`, so give each
/// process its own `--file-prefix` to tell them apart.
pub fn socket_path() -> Option<PathBuf> {
    let eal = Eal::get()?;
    if eal.args.iter().any(|a| a == "--no-telemetry") {
        return None;
    }
    // SAFETY: EAL is running; the function returns a pointer to a static NUL-terminated string.
    let dir = unsafe { CStr::from_ptr(dpdk_sys::rte_eal_get_runtime_dir()) };
    Some(Path::new(&*dir.to_string_lossy()).join("dpdk_telemetry.v2"))
}

/// The answer `{"error": why}`.
pub fn error(why: impl std::fmt::Display) -> Value {
    json!({ "error": why.to_string() })
}

fn stopped() -> Value {
    json!({"stopped": 1, "reason": "whatever served this command has stopped"})
}

/// The handler's answer to `cmd`, panics caught.
fn answer(cmd: &str, params: &str) -> Value {
    let reg = registry();
    match reg.get(cmd) {
        None => error(format!("{cmd} is not registered here")),
        Some(None) => stopped(),
        Some(Some(handler)) => {
            catch_unwind(AssertUnwindSafe(|| handler(params))).unwrap_or_else(|payload| {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                error(format!("the handler panicked: {msg}"))
            })
        }
    }
}

/// What DPDK calls for every registered command.
extern "C" fn trampoline(cmd: *const c_char, params: *const c_char, d: *mut rte_tel_data) -> c_int {
    let text = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: DPDK passes NUL-terminated strings that live for the call (params is
            // NULL when the request has no comma).
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    let done = catch_unwind(AssertUnwindSafe(|| {
        let cmd = text(cmd);
        let value = answer(&cmd, &text(params));
        let tel = to_tel(&value)
            .and_then(|t| check_output_len(&cmd, &t).map(|()| t))
            .unwrap_or_else(|e| error_tel(&e.to_string()));
        // SAFETY: `d` is the data DPDK handed this callback.
        if unsafe { emit_top(d, &tel) }.is_err() {
            // A container could not be allocated: what was added so far is dropped (and leaks);
            // the client still gets a reason.
            // SAFETY: as above.
            return unsafe { emit_top(d, &error_tel("out of memory building the answer")) }.is_ok();
        }
        true
    }));
    match done {
        Ok(true) => 0,
        _ => -1,
    }
}

fn error_tel(why: &str) -> TelValue {
    TelValue::Dict(vec![(
        "error".into(),
        TelValue::Scalar(TelScalar::Str(clip(why))),
    )])
}

/// A scalar as DPDK 22.11 stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TelScalar {
    U64(u64),
    Int(i32),
    Str(String),
}

/// The element type of an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayKind {
    U64,
    Int,
    Str,
}

/// A value DPDK 22.11 can carry: every limit of the module doc already checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TelValue {
    Scalar(TelScalar),
    Dict(Vec<(String, TelValue)>),
    /// Scalars, all of `kind`.
    Array(ArrayKind, Vec<TelScalar>),
}

/// Why a value cannot be an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TelError {
    #[error("key {key:?} at {path:?}: only A-Z a-z 0-9 _ / and at most {MAX_STRING_LEN} bytes")]
    BadKey { path: String, key: String },
    #[error("{path:?} has {count} entries, over DPDK's {max}")]
    TooMany {
        path: String,
        count: usize,
        max: usize,
    },
    #[error("answer of {len} bytes, over DPDK's {MAX_OUTPUT_LEN}: ask for less (params)")]
    TooLong { len: usize },
}

fn valid_key(key: &str) -> bool {
    key.len() <= MAX_STRING_LEN
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'/')
}

/// `s` as DPDK stores it without loss: control characters replaced by `?`, and at most
/// [`MAX_STRING_LEN`] bytes, a longer string cut at a character boundary and marked `...`.
pub fn clip(s: &str) -> String {
    clip_to(s, MAX_STRING_LEN)
}

fn clip_to(s: &str, max: usize) -> String {
    let clean: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if clean.len() <= max {
        return clean;
    }
    let mut end = max - 3;
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &clean[..end])
}

fn scalar(v: &Value) -> TelScalar {
    match v {
        Value::Null => TelScalar::Str("null".into()),
        Value::Bool(b) => TelScalar::Int(i32::from(*b)),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                TelScalar::U64(u)
            } else if let Some(i) = n.as_i64().and_then(|i| i32::try_from(i).ok()) {
                TelScalar::Int(i)
            } else {
                TelScalar::Str(n.to_string())
            }
        }
        Value::String(s) => TelScalar::Str(clip(s)),
        Value::Array(_) | Value::Object(_) => unreachable!("only called on scalars"),
    }
}

fn as_text(s: &TelScalar) -> TelScalar {
    match s {
        TelScalar::U64(u) => TelScalar::Str(u.to_string()),
        TelScalar::Int(i) => TelScalar::Str(i.to_string()),
        TelScalar::Str(_) => s.clone(),
    }
}

/// An array of scalars in the narrowest type that holds them all.
fn array(items: &[Value]) -> TelValue {
    let scalars: Vec<TelScalar> = items.iter().map(scalar).collect();
    let fits_int = |s: &TelScalar| match s {
        TelScalar::U64(u) => i32::try_from(*u).is_ok(),
        TelScalar::Int(_) => true,
        TelScalar::Str(_) => false,
    };
    if scalars.iter().all(|s| matches!(s, TelScalar::U64(_))) {
        TelValue::Array(ArrayKind::U64, scalars)
    } else if scalars.iter().all(fits_int) {
        let ints = scalars
            .iter()
            .map(|s| match s {
                TelScalar::U64(u) => TelScalar::Int(*u as i32),
                other => other.clone(),
            })
            .collect();
        TelValue::Array(ArrayKind::Int, ints)
    } else {
        TelValue::Array(ArrayKind::Str, scalars.iter().map(as_text).collect())
    }
}

fn convert(v: &Value, path: &str) -> Result<TelValue, TelError> {
    let child = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}/{key}")
        }
    };
    let too_many = |count, max| TelError::TooMany {
        path: if path.is_empty() {
            "/".into()
        } else {
            path.into()
        },
        count,
        max,
    };
    match v {
        Value::Object(map) => {
            if map.len() > MAX_DICT_ENTRIES {
                return Err(too_many(map.len(), MAX_DICT_ENTRIES));
            }
            let mut entries = Vec::with_capacity(map.len());
            for (k, x) in map {
                if !valid_key(k) {
                    return Err(TelError::BadKey {
                        path: path.into(),
                        key: k.clone(),
                    });
                }
                entries.push((k.clone(), convert(x, &child(k))?));
            }
            Ok(TelValue::Dict(entries))
        }
        Value::Array(items) if items.iter().all(|x| !x.is_array() && !x.is_object()) => {
            if items.len() > MAX_ARRAY_ENTRIES {
                return Err(too_many(items.len(), MAX_ARRAY_ENTRIES));
            }
            Ok(array(items))
        }
        Value::Array(items) => {
            if items.len() > MAX_DICT_ENTRIES {
                return Err(too_many(items.len(), MAX_DICT_ENTRIES));
            }
            let mut entries = Vec::with_capacity(items.len());
            for (i, x) in items.iter().enumerate() {
                let k = i.to_string();
                entries.push((k.clone(), convert(x, &child(&k))?));
            }
            Ok(TelValue::Dict(entries))
        }
        _ => Ok(TelValue::Scalar(scalar(v))),
    }
}

/// `v` as DPDK 22.11 can carry it (see the module doc), or why it cannot be. A bare number
/// becomes a string (an answer is a dict, an array or a string).
pub fn to_tel(v: &Value) -> Result<TelValue, TelError> {
    match convert(v, "")? {
        TelValue::Scalar(s) => Ok(TelValue::Scalar(match s {
            TelScalar::Str(_) => match v {
                Value::String(s) => TelScalar::Str(clip_to(s, MAX_SINGLE_STRING_LEN)),
                _ => s,
            },
            other => as_text(&other),
        })),
        t => Ok(t),
    }
}

/// Bytes of `s` as a JSON string, quotes included (DPDK escapes `"` and `\`).
fn json_string_len(s: &str) -> usize {
    2 + s.len() + s.bytes().filter(|&b| b == b'"' || b == b'\\').count()
}

/// Bytes of `t` as DPDK writes it (`{"k": v, "k2": v2}`, `[1, 2]`).
pub fn json_len(t: &TelValue) -> usize {
    let list = |n: usize| 2 + n.saturating_sub(1) * 2;
    match t {
        TelValue::Scalar(TelScalar::U64(u)) => u.to_string().len(),
        TelValue::Scalar(TelScalar::Int(i)) => i.to_string().len(),
        TelValue::Scalar(TelScalar::Str(s)) => json_string_len(s),
        TelValue::Dict(entries) => {
            list(entries.len())
                + entries
                    .iter()
                    .map(|(k, v)| json_string_len(k) + 2 + json_len(v))
                    .sum::<usize>()
        }
        TelValue::Array(_, items) => {
            list(items.len())
                + items
                    .iter()
                    .map(|s| json_len(&TelValue::Scalar(s.clone())))
                    .sum::<usize>()
        }
    }
}

/// Whether the answer to `cmd` fits DPDK's output buffer (with room to spare for the
/// trailing NUL and rounding in DPDK's own formatting).
fn check_output_len(cmd: &str, t: &TelValue) -> Result<(), TelError> {
    let len = json_string_len(cmd) + 4 + json_len(t);
    if len + 64 > MAX_OUTPUT_LEN {
        return Err(TelError::TooLong { len });
    }
    Ok(())
}

/// A DPDK call's result: 0 is success (E2BIG, positive, is a truncation `to_tel` prevents).
fn ok(rc: c_int) -> Result<(), c_int> {
    if rc == 0 { Ok(()) } else { Err(rc) }
}

fn c_text(s: &str) -> CString {
    // Interior NULs cannot come from `clip` (a control character), nor from a valid key.
    CString::new(s).unwrap_or_default()
}

/// Writes the top-level answer into `d`.
///
/// # Safety
/// `d` is the `rte_tel_data` DPDK passed to the callback (or one from `rte_tel_data_alloc`).
unsafe fn emit_top(d: *mut rte_tel_data, t: &TelValue) -> Result<(), c_int> {
    match t {
        TelValue::Scalar(s) => {
            let text = match as_text(s) {
                TelScalar::Str(s) => s,
                _ => unreachable!("as_text gives a string"),
            };
            // SAFETY: `d` is valid (the caller's contract); the string is NUL-terminated.
            ok(unsafe { dpdk_sys::rte_tel_data_string(d, c_text(&text).as_ptr()) })
        }
        // SAFETY: as the caller's.
        _ => unsafe { emit(d, t) },
    }
}

/// Writes a dict or an array into the fresh `d`.
///
/// # Safety
/// As for [`emit_top`]; `t` is a dict or an array.
unsafe fn emit(d: *mut rte_tel_data, t: &TelValue) -> Result<(), c_int> {
    use dpdk_sys::*;
    match t {
        TelValue::Dict(entries) => {
            // SAFETY (this arm): `d` is valid; every name and string is NUL-terminated and
            // copied by DPDK; a container is a fresh allocation handed over with keep = 0
            // (DPDK frees it with `d`) or freed here when DPDK did not take it.
            ok(unsafe { rte_tel_data_start_dict(d) })?;
            for (k, v) in entries {
                let name = c_text(k);
                match v {
                    TelValue::Scalar(TelScalar::U64(u)) => {
                        ok(unsafe { rte_tel_data_add_dict_u64(d, name.as_ptr(), *u) })?
                    }
                    TelValue::Scalar(TelScalar::Int(i)) => {
                        ok(unsafe { rte_tel_data_add_dict_int(d, name.as_ptr(), *i) })?
                    }
                    TelValue::Scalar(TelScalar::Str(s)) => ok(unsafe {
                        rte_tel_data_add_dict_string(d, name.as_ptr(), c_text(s).as_ptr())
                    })?,
                    _ => {
                        let c = unsafe { rte_tel_data_alloc() };
                        if c.is_null() {
                            return Err(-12);
                        }
                        let added = unsafe { emit(c, v) }.and_then(|()| {
                            ok(unsafe { rte_tel_data_add_dict_container(d, name.as_ptr(), c, 0) })
                        });
                        if added.is_err() {
                            unsafe { rte_tel_data_free(c) };
                        }
                        added?
                    }
                }
            }
            Ok(())
        }
        TelValue::Array(kind, items) => {
            let ty = match kind {
                ArrayKind::U64 => rte_tel_value_type_RTE_TEL_U64_VAL,
                ArrayKind::Int => rte_tel_value_type_RTE_TEL_INT_VAL,
                ArrayKind::Str => rte_tel_value_type_RTE_TEL_STRING_VAL,
            };
            // SAFETY (this arm): `d` is valid; strings are NUL-terminated and copied.
            ok(unsafe { rte_tel_data_start_array(d, ty) })?;
            for s in items {
                match s {
                    TelScalar::U64(u) => ok(unsafe { rte_tel_data_add_array_u64(d, *u) })?,
                    TelScalar::Int(i) => ok(unsafe { rte_tel_data_add_array_int(d, *i) })?,
                    TelScalar::Str(s) => {
                        ok(unsafe { rte_tel_data_add_array_string(d, c_text(s).as_ptr()) })?
                    }
                }
            }
            Ok(())
        }
        TelValue::Scalar(_) => Err(-22),
    }
}

/// A telemetry client: one connection to a telemetry socket (any DPDK process's).
pub struct Client {
    fd: OwnedFd,
    /// What the socket said first: `{"version": ..., "pid": ..., "max_output_len": ...}`.
    pub info: Value,
}

impl Client {
    /// Connects to `path` (a `dpdk_telemetry.v2` socket) and reads its greeting. Every read
    /// waits at most `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> io::Result<Client> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_os_str().as_bytes();
        // SAFETY: a zeroed sockaddr_un is a valid (empty) address.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        if bytes.len() >= addr.sun_path.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("socket path {} is too long", path.display()),
            ));
        }
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as c_char;
        }
        // SAFETY: plain system call; the result is checked.
        let raw =
            unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: `tv` is a valid timeval of the size given.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `addr` is an initialised sockaddr_un of the size given.
        let rc = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display())));
        }
        let mut client = Client {
            fd,
            info: Value::Null,
        };
        client.info = client.receive()?;
        Ok(client)
    }

    /// One message from the socket, as JSON.
    fn receive(&self) -> io::Result<Value> {
        let mut buf = vec![0u8; 4 * MAX_OUTPUT_LEN];
        // SAFETY: `buf` has room for `buf.len()` bytes.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the telemetry socket closed the connection",
            ));
        }
        serde_json::from_slice(&buf[..n as usize]).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "not JSON ({e}): {:?}",
                    String::from_utf8_lossy(&buf[..n as usize])
                ),
            )
        })
    }

    /// Sends `request` (`/command` or `/command,params`) and returns the whole answer,
    /// `{"/command": ...}`.
    pub fn query(&self, request: &str) -> io::Result<Value> {
        // SAFETY: the pointer and length describe `request`'s bytes.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        self.receive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> TelValue {
        TelValue::Scalar(TelScalar::Str(x.into()))
    }

    #[test]
    fn command_names_follow_dpdk() {
        assert!(valid_command_name("/portico/workers"));
        assert!(valid_command_name("/a_b/C9"));
        for bad in ["portico", "/portico/qps-live", "/x y", "/é", ""] {
            assert!(!valid_command_name(bad), "{bad}");
        }
        assert!(valid_command_name(&format!("/{}", "a".repeat(54))));
        assert!(!valid_command_name(&format!("/{}", "a".repeat(55))));
    }

    #[test]
    fn numbers_take_the_types_dpdk_has() {
        let t = to_tel(
            &json!({"u": 7u64, "big": u64::MAX, "neg": -3, "wide": -5_000_000_000i64,
                               "f": 0.25, "t": true, "n": null}),
        )
        .unwrap();
        let TelValue::Dict(e) = t else { panic!() };
        let get = |k: &str| e.iter().find(|(n, _)| n == k).unwrap().1.clone();
        assert_eq!(get("u"), TelValue::Scalar(TelScalar::U64(7)));
        assert_eq!(get("big"), TelValue::Scalar(TelScalar::U64(u64::MAX)));
        assert_eq!(get("neg"), TelValue::Scalar(TelScalar::Int(-3)));
        assert_eq!(get("wide"), s("-5000000000"));
        assert_eq!(get("f"), s("0.25"));
        assert_eq!(get("t"), TelValue::Scalar(TelScalar::Int(1)));
        assert_eq!(get("n"), s("null"));
    }

    #[test]
    fn arrays_take_one_type_and_objects_in_arrays_become_dicts() {
        assert_eq!(
            to_tel(&json!([1, 2])).unwrap(),
            TelValue::Array(ArrayKind::U64, vec![TelScalar::U64(1), TelScalar::U64(2)])
        );
        assert_eq!(
            to_tel(&json!([1, -2])).unwrap(),
            TelValue::Array(ArrayKind::Int, vec![TelScalar::Int(1), TelScalar::Int(-2)])
        );
        assert_eq!(
            to_tel(&json!([1, "a"])).unwrap(),
            TelValue::Array(
                ArrayKind::Str,
                vec![TelScalar::Str("1".into()), TelScalar::Str("a".into())]
            )
        );
        assert_eq!(
            to_tel(&json!([{"a": 1}, [2]])).unwrap(),
            TelValue::Dict(vec![
                (
                    "0".into(),
                    TelValue::Dict(vec![("a".into(), TelValue::Scalar(TelScalar::U64(1)))])
                ),
                (
                    "1".into(),
                    TelValue::Array(ArrayKind::U64, vec![TelScalar::U64(2)])
                ),
            ])
        );
        // A bare number is answered as a string.
        assert_eq!(to_tel(&json!(5)).unwrap(), s("5"));
    }

    #[test]
    fn limits_are_errors_not_silent_cuts() {
        let e = to_tel(&json!({"a": {"bad-key": 1}})).unwrap_err();
        assert_eq!(
            e,
            TelError::BadKey {
                path: "a".into(),
                key: "bad-key".into()
            }
        );
        let wide: serde_json::Map<String, Value> =
            (0..257).map(|i| (format!("k{i}"), json!(i))).collect();
        let e = to_tel(&json!({ "w": wide })).unwrap_err();
        assert_eq!(
            e,
            TelError::TooMany {
                path: "w".into(),
                count: 257,
                max: 256
            }
        );
        assert!(to_tel(&json!((0..513).collect::<Vec<_>>())).is_err());
        assert!(to_tel(&json!((0..512).collect::<Vec<_>>())).is_ok());
        // 200 entries of 100 bytes: over 16 KiB.
        let big: serde_json::Map<String, Value> = (0..200)
            .map(|i| (format!("k{i}"), json!("x".repeat(90))))
            .collect();
        let t = to_tel(&Value::Object(big)).unwrap();
        assert!(matches!(
            check_output_len("/x", &t),
            Err(TelError::TooLong { .. })
        ));
    }

    #[test]
    fn long_strings_are_cut_with_a_mark() {
        let long = "é".repeat(100);
        let c = clip(&long);
        assert!(c.len() <= MAX_STRING_LEN, "{}", c.len());
        assert!(c.ends_with("..."));
        assert!(long.starts_with(c.trim_end_matches("...")));
        assert_eq!(clip("a\tb\u{1}"), "a?b?");
        assert_eq!(clip("short"), "short");
    }

    #[test]
    fn json_len_matches_dpdk_formatting() {
        // As DPDK writes it: {"a": 1, "b": "x\"y", "c": [1, 2], "d": {"e": -1}}
        let t = to_tel(&json!({"a": 1, "b": "x\"y", "c": [1, 2], "d": {"e": -1}})).unwrap();
        assert_eq!(
            json_len(&t),
            r#"{"a": 1, "b": "x\"y", "c": [1, 2], "d": {"e": -1}}"#.len()
        );
    }
}
