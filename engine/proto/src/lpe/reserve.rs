//! Slots reserved up front and written as first used, with a free stack: the storage of the
//! entry lists' nodes (`list::Slab`), the unexpected list's headers and an endpoint's
//! overflow accounts.
//!
//! Taking and giving back a slot are O(1) and never allocate: the whole capacity is reserved
//! when the list is made, but a slot is written only the first time it is taken, so a list
//! bounded by the seed's 16 K entries costs memory for the entries it has held, not for its
//! bound. The slots used so far are reachable as a slice (`Deref`), indexed by slot number.

use core::ops::{Deref, DerefMut};

#[derive(Debug, Clone)]
pub(crate) struct Reserve<T> {
    /// The slots used so far (at most `capacity`, reserved up front).
    slots: Vec<T>,
    /// Slots given back, taken again first.
    free: Vec<u32>,
    capacity: usize,
}

impl<T> Reserve<T> {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Reserve {
            slots: Vec::with_capacity(capacity),
            free: Vec::with_capacity(capacity),
            capacity,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots in use.
    #[inline]
    pub(crate) fn in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether every slot is in use.
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.free.is_empty() && self.slots.len() >= self.capacity
    }

    /// A slot given back, or else the next never-used one, written as `blank` (within the
    /// reservation: no allocation); `None` when every slot is in use.
    #[inline]
    pub(crate) fn take(&mut self, blank: T) -> Option<u32> {
        if let Some(slot) = self.free.pop() {
            return Some(slot);
        }
        if self.slots.len() >= self.capacity {
            return None;
        }
        self.slots.push(blank);
        Some((self.slots.len() - 1) as u32)
    }

    /// Gives `slot` back (its contents stay until it is taken again).
    #[inline]
    pub(crate) fn give(&mut self, slot: u32) {
        self.free.push(slot);
    }
}

impl<T> Deref for Reserve<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.slots
    }
}

impl<T> DerefMut for Reserve<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_written_as_first_taken_given_back_reused_and_never_beyond_the_capacity() {
        let mut r = Reserve::with_capacity(3);
        assert_eq!((r.len(), r.in_use(), r.is_full()), (0, 0, false));
        assert_eq!(r.take(7u8), Some(0));
        assert_eq!(r.take(8), Some(1));
        r[1] = 9;
        r.give(0);
        assert_eq!(r.in_use(), 1);
        // A slot given back is taken again before a new one, keeping what it held.
        assert_eq!(r.take(0), Some(0));
        assert_eq!(&*r, &[7, 9]);
        assert_eq!(r.take(1), Some(2));
        assert!(r.is_full());
        assert_eq!(r.take(2), None);
        assert_eq!((r.len(), r.in_use(), r.capacity()), (3, 3, 3));
    }
}
