//! Registering non-EAL threads with EAL. An unregistered thread has no lcore id, so mempool
//! get/put bypass the per-lcore cache and hit the shared ring on every call; workers register.

use std::marker::PhantomData;

use super::{DpdkError, Eal};

/// Registration of the current thread as an EAL lcore; unregisters on drop. Not `Send`: it
/// belongs to the thread that made it.
pub struct ThreadRegistration {
    _thread_bound: PhantomData<*const ()>,
}

impl ThreadRegistration {
    /// Registers the calling thread. Requires a running EAL.
    pub fn register() -> Result<Self, DpdkError> {
        if Eal::get().is_none() {
            return Err(DpdkError {
                what: "rte_thread_register".into(),
                code: 0,
                text: "EAL is not running".into(),
            });
        }
        // SAFETY: EAL is initialised; registration affects only the calling thread.
        let rc = unsafe { dpdk_sys::rte_thread_register() };
        if rc < 0 {
            return Err(DpdkError::from_code("rte_thread_register", rc));
        }
        Ok(ThreadRegistration {
            _thread_bound: PhantomData,
        })
    }
}

impl Drop for ThreadRegistration {
    fn drop(&mut self) {
        // SAFETY: this thread registered itself in `register` and unregisters once.
        unsafe { dpdk_sys::rte_thread_unregister() }
    }
}

/// The calling thread's lcore id, or `None` for an unregistered thread.
pub fn lcore_id() -> Option<u32> {
    // SAFETY: reads a thread-local value.
    let id = unsafe { dpdk_sys::portico_lcore_id() };
    (id != u32::MAX).then_some(id)
}
