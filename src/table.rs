//! The registration table: a slot is found by index without a table-wide lock.
//!
//! Which slot a new registration gets, and which descriptor number is registered
//! where, is decided under one mutex (`Alloc`: a [`Slab`] of slot indices and a map
//! by number), taken only by register and deregister. What a slot holds lives in
//! chunks allocated on first use and freed only with the table, so `arm`, `disarm`
//! and `deliver` reach a slot with one atomic load and lock only that slot: threads
//! working on different registrations share no cache line in the table.
//!
//! Chunk `c` holds `FIRST << c` slots, for slot indices `FIRST * (2^c - 1)` up to
//! (not including) `FIRST * (2^(c+1) - 1)`; 27 chunks cover every 32-bit slot index.

use crate::state::RegState;
use crate::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use crate::sync::{Mutex, MutexGuard};
use crate::token::Token;
use slab::Slab;
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::PoisonError;

/// Slots in the first chunk.
const FIRST: usize = 64;
/// Chunks: enough for `u32::MAX` slots.
const CHUNKS: usize = 27;

/// A live registration.
pub(crate) struct Entry {
    pub(crate) fd: RawFd,
    pub(crate) token: Token,
    pub(crate) state: RegState,
}

/// One slot: empty, or a registration behind its own lock. The lock is held across
/// the kernel command for that registration, so its state has one owner at a time.
#[derive(Default)]
pub(crate) struct Slot {
    inner: Mutex<Option<Entry>>,
    /// The generation the slot's last registration ended at: the next one starts
    /// there, so the tags one slot hands out do not repeat before 2^32 armings, and
    /// events still queued for an earlier registration are stale (wrap-around
    /// included). Read and written only under the allocation lock.
    generation: AtomicU32,
}

impl Slot {
    /// Locks the slot. A panic elsewhere cannot leave a `RegState` half-written
    /// (every transition is a plain assignment after the kernel answered), so
    /// poisoning carries no information and is ignored.
    #[inline(always)]
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Entry>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the next registration in this slot starts (under the allocation lock).
    pub(crate) fn next_generation(&self, _held: &Alloc) -> u32 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Records where the freed registration ended (under the allocation lock).
    pub(crate) fn set_next_generation(&self, _held: &Alloc, generation: u32) {
        self.generation.store(generation, Ordering::Relaxed);
    }

    /// The slot's contents, through exclusive access.
    pub(crate) fn get_mut(&mut self) -> &mut Option<Entry> {
        self.inner.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Slot allocation: taken only by register and deregister.
pub(crate) struct Alloc {
    /// Occupied slot indices, with the descriptor number each holds.
    pub(crate) slab: Slab<RawFd>,
    /// Which slot holds each registered descriptor number.
    pub(crate) by_fd: HashMap<RawFd, usize>,
}

/// The table. See the module docs.
pub(crate) struct Table {
    alloc: Mutex<Alloc>,
    /// Written once each (null to a chunk) under `alloc`, freed only by `Drop`.
    chunks: [AtomicPtr<Slot>; CHUNKS],
}

/// `(chunk, offset)` of slot `index`.
#[inline(always)]
fn locate(index: usize) -> (usize, usize) {
    let n = index / FIRST + 1;
    let chunk = (usize::BITS - 1 - n.leading_zeros()) as usize;
    (chunk, index - FIRST * ((1 << chunk) - 1))
}

impl Table {
    pub(crate) fn new() -> Table {
        Table {
            alloc: Mutex::new(Alloc {
                slab: Slab::new(),
                by_fd: HashMap::new(),
            }),
            chunks: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
        }
    }

    /// Locks allocation (register, deregister, `len`).
    pub(crate) fn alloc(&self) -> MutexGuard<'_, Alloc> {
        self.alloc.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Allocation, through exclusive access.
    pub(crate) fn alloc_mut(&mut self) -> &mut Alloc {
        self.alloc.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    /// Slot `index`, if its chunk exists (it does for every index the slab handed
    /// out). Lock-free: one acquire load.
    #[inline(always)]
    pub(crate) fn get(&self, index: usize) -> Option<&Slot> {
        let (chunk, offset) = locate(index);
        let base = self.chunks.get(chunk)?.load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: a non-null chunk pointer came from `Box::into_raw` of a slice of
        // `FIRST << chunk` slots (see `slot_for_insert`), `offset` is below that by
        // `locate`, and chunks are freed only in `drop`, which needs `&mut self`,
        // so the slot outlives this borrow of `self`.
        Some(unsafe { &*base.add(offset) })
    }

    /// Slot `index` for a new registration, creating its chunk if needed. Taking
    /// `&Alloc` proves the allocation lock is held, so no two threads create a
    /// chunk at once.
    pub(crate) fn slot_for_insert(&self, _held: &Alloc, index: usize) -> &Slot {
        let (chunk, _) = locate(index);
        if self.chunks[chunk].load(Ordering::Acquire).is_null() {
            let slots: Box<[Slot]> = (0..FIRST << chunk).map(|_| Slot::default()).collect();
            self.chunks[chunk].store(Box::into_raw(slots).cast::<Slot>(), Ordering::Release);
        }
        self.get(index).expect("the chunk was just created")
    }

    /// Slot `index` through exclusive access.
    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut Slot> {
        let (chunk, offset) = locate(index);
        // `&mut self`: no other access; a relaxed load reads the last store.
        let base = self.chunks.get_mut(chunk)?.load(Ordering::Relaxed);
        if base.is_null() {
            return None;
        }
        // SAFETY: as in `get`; `&mut self` makes the access exclusive.
        Some(unsafe { &mut *base.add(offset) })
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        for (chunk, p) in self.chunks.iter_mut().enumerate() {
            let base = p.load(Ordering::Relaxed);
            if !base.is_null() {
                let len = FIRST << chunk;
                // SAFETY: `base` came from `Box::<[Slot]>::into_raw` of exactly `len`
                // slots in `slot_for_insert`, and is freed only here, once.
                drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(base, len)) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_covers_indices_without_gaps_or_overlap() {
        let mut expect = (0, 0);
        for index in 0..FIRST * 15 {
            assert_eq!(locate(index), expect, "index {index}");
            expect.1 += 1;
            if expect.1 == FIRST << expect.0 {
                expect = (expect.0 + 1, 0);
            }
        }
        assert!(locate(u32::MAX as usize - 1).0 < CHUNKS);
    }

    #[test]
    fn slots_are_created_on_insert_and_found_after() {
        let table = Table::new();
        assert!(table.get(0).is_none());
        let alloc = table.alloc();
        for index in [0, 63, 64, 191, 192, 5000] {
            let a = table.slot_for_insert(&alloc, index) as *const Slot;
            let b = table.get(index).unwrap() as *const Slot;
            assert_eq!(a, b);
        }
        assert!(table.get(10_000).is_none());
    }
}
