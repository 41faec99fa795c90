//! Each slot's request record, reachable without the ring's mutex.
//!
//! The leader takes the common completion (the current request of a slot,
//! fired with readiness its arming asks for) against the slot's word alone:
//! one load and one compare-and-swap, no mutex, so that its events go straight
//! to the poller's table (`Driver::wait_each`) and an entering wait takes the
//! mutex once. An arm writes the word under the mutex, which also guards the
//! submission queue; a completion of any other kind is routed under the
//! mutex (`complete.rs`).
//!
//! The word of a slot ([`Req::word`]): the generation of its latest arming
//! (bits 32 to 63), its poll requests in flight (pushed, and whose completion
//! has not been taken: bits 8 to 31; each oneshot request ends with exactly
//! one completion), the latest arming's interest ([`Interest::bits`] in bits 3
//! to 5, which the rare paths turn back into its `poll32_events`), and three
//! flags: [`PENDING`] (a poll request of that arming is in the kernel or
//! queued), [`READS`] (the arming asks for `POLLIN`), [`ODD`] (the slot has
//! state the rare paths keep under the mutex, `Odd` in `ring.rs`: its
//! completions and arms go there). A record is its word alone: the
//! descriptor is the slot's number ([`fd_of`]).
//!
//! Records live in pages of 1,024 (8 KiB, zeroed: an all-zero record is a
//! slot with nothing armed), freed with the ring. Page 0 is allocated with the
//! ring (most descriptor numbers are below 1,024, and its lookup then needs no
//! load of a pointer); page `p` from 1 on is allocated under the mutex on first
//! use and found
//! through a directory of 21 segments, segment `s` holding `2^s` page pointers
//! (pages `2^s` to `2^(s+1) - 1`), so every slot below 2^31 has a place. Every
//! pointer is written once, from null to an allocation, under the mutex, and
//! read with acquire: a lookup is lock-free.

use super::submit::poll_events;
use crate::interest::Interest;
use rustix::fd::RawFd;
use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// A poll request of the slot's latest arming is in the kernel or queued.
pub(super) const PENDING: u64 = 1;
/// The latest arming asks for `POLLIN`.
pub(super) const READS: u64 = 1 << 1;
/// The rare paths keep state for the slot (under the mutex).
pub(super) const ODD: u64 = 1 << 2;
/// Where the latest arming's [`Interest::bits`] sit.
const INTEREST_SHIFT: u32 = 3;
/// The latest arming's interest.
const INTEREST: u64 = 0b111 << INTEREST_SHIFT;
/// The generation's bits.
pub(super) const GENERATION: u64 = !((1 << 32) - 1);
const _: () = assert!(INTEREST & (PENDING | READS | ODD | COUNT | GENERATION) == 0);
/// One poll request in flight.
pub(super) const ONE: u64 = 1 << 8;
/// The requests in flight.
const COUNT: u64 = ((1 << 24) - 1) * ONE;
/// A word with none of these has nothing in flight, nothing pending and no
/// rare state: the word after a delivery, which an arm writes with one store.
pub(super) const BUSY: u64 = ODD | PENDING | COUNT;

/// The generation in a slot's word.
#[inline(always)]
pub(super) fn generation(word: u64) -> u32 {
    (word >> 32) as u32
}

/// The poll requests in flight in a slot's word.
#[inline(always)]
pub(super) fn inflight(word: u64) -> u32 {
    ((word & COUNT) / ONE) as u32
}

/// The word's flags for an arming for `interest`: [`READS`] if it reads, and
/// the interest itself.
#[inline(always)]
pub(super) fn interest_flags(interest: Interest) -> u64 {
    let reads = if interest.is_readable() { READS } else { 0 };
    reads | u64::from(interest.bits()) << INTEREST_SHIFT
}

/// The `poll32_events` of the latest arming a slot's word names (0 if none).
#[inline]
pub(super) fn events_of(word: u64) -> u32 {
    Interest::from_bits(((word & INTEREST) >> INTEREST_SHIFT) as u8).map_or(0, poll_events)
}

/// The descriptor a slot holds: its number (`raw::fd_at` on Linux).
#[inline(always)]
pub(super) fn fd_of(slot: u32) -> RawFd {
    crate::raw::fd_at(slot as usize)
}

/// `word` with its requests in flight replaced by those of `count_of`.
#[inline(always)]
pub(super) fn with_count(word: u64, count_of: u64) -> u64 {
    (word & !COUNT) | (count_of & COUNT)
}

/// One slot's record: its word. See the module docs.
#[derive(Debug, Default)]
pub(super) struct Req {
    pub(super) word: AtomicU64,
}

// SAFETY: `Reqs` owns its pages (freed by its `drop` only) and hands out
// `&Req`, whose fields are atomics: as a `Box<[Req]>` would be, it is `Send`
// and `Sync`.
unsafe impl Send for Reqs {}
// SAFETY: as above.
unsafe impl Sync for Reqs {}

/// Records per page.
const PAGE: usize = 1024;
/// Directory segments: pages 1 to 2^21 - 1, enough for 2^31 slots.
const SEGMENTS: usize = 21;
const _: () = assert!((PAGE << SEGMENTS) >= 1 << 31);

/// Every slot's record. See the module docs.
#[derive(Debug)]
pub(super) struct Reqs {
    /// Page 0, allocated with the ring: most descriptor numbers are below 1,024.
    first: NonNull<Req>,
    segments: [AtomicPtr<AtomicPtr<Req>>; SEGMENTS],
}

/// Allocates `n` zeroed values of `T` (all-zero is a valid `T` for the caller).
fn zeroed<T>(n: usize) -> *mut T {
    let layout = Layout::array::<T>(n).expect("a record page's layout");
    // SAFETY: the layout's size is not zero (`n` and `size_of::<T>()` are not).
    let p = unsafe { alloc_zeroed(layout) };
    if p.is_null() {
        handle_alloc_error(layout);
    }
    p.cast()
}

/// Frees what [`zeroed`] allocated for `n` values.
///
/// # Safety
/// `p` came from `zeroed::<T>(n)` and is not used afterwards.
unsafe fn free<T>(p: *mut T, n: usize) {
    let layout = Layout::array::<T>(n).expect("a record page's layout");
    // SAFETY: the caller's promise: allocated with this layout.
    unsafe { dealloc(p.cast(), layout) };
}

/// The directory place of page `page` (1 or more): its segment and index there.
#[inline(always)]
fn place(page: usize) -> (usize, usize) {
    let segment = (usize::BITS - 1 - page.leading_zeros()) as usize;
    (segment, page - (1 << segment))
}

impl Reqs {
    pub(super) fn new() -> Reqs {
        Reqs {
            first: NonNull::new(zeroed::<Req>(PAGE)).expect("zeroed answers non-null"),
            segments: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
        }
    }

    /// Slot `slot`'s record, if its page was allocated (it was for every slot
    /// ever armed). Lock-free.
    #[inline(always)]
    pub(super) fn get(&self, slot: u32) -> Option<&Req> {
        let s = slot as usize;
        if s < PAGE {
            // SAFETY: page 0 lives as long as `self` (freed by `drop`); `s`
            // is in bounds.
            return Some(unsafe { &*self.first.as_ptr().add(s) });
        }
        let page = self.page(s / PAGE);
        if page.is_null() {
            return None;
        }
        // SAFETY: a non-null page pointer was stored (release, read with
        // acquire) by `grow` from `zeroed::<Req>(PAGE)`, and is freed only by
        // `drop` (`&mut self`), after this borrow; `s % PAGE` is in bounds.
        Some(unsafe { &*page.add(s % PAGE) })
    }

    /// Page `page`'s pointer (null if not allocated), `page` 1 or more.
    #[inline(never)]
    fn page(&self, page: usize) -> *mut Req {
        let (segment, index) = place(page);
        let Some(dir) = self.segments.get(segment) else {
            return std::ptr::null_mut();
        };
        let dir = dir.load(Ordering::Acquire);
        if dir.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: a non-null segment came from `zeroed::<AtomicPtr<Req>>(1 <<
        // segment)` (`grow`), freed only by `drop`; `index < 1 << segment`.
        unsafe { &*dir.add(index) }.load(Ordering::Acquire)
    }

    /// Slot `slot`'s record, allocating its page. Under the ring's mutex (the
    /// only place records are allocated).
    #[inline(always)]
    pub(super) fn get_or_grow(&self, slot: u32) -> &Req {
        match self.get(slot) {
            Some(r) => r,
            None => self.grow(slot),
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&self, slot: u32) -> &Req {
        let s = slot as usize;
        // Page 0 is always there: `get` found nothing at 1,024 or more.
        let (segment, index) = place(s / PAGE);
        let dir = &self.segments[segment];
        if dir.load(Ordering::Acquire).is_null() {
            dir.store(zeroed::<AtomicPtr<Req>>(1 << segment), Ordering::Release);
        }
        // SAFETY: as in `page`: allocated above or before, freed by `drop`.
        let at = unsafe { &*dir.load(Ordering::Acquire).add(index) };
        if at.load(Ordering::Acquire).is_null() {
            at.store(zeroed::<Req>(PAGE), Ordering::Release);
        }
        self.get(slot)
            .expect("the record's page was just allocated")
    }

    /// Calls `f` with every allocated record and its slot (a thread's exit).
    pub(super) fn each(&self, mut f: impl FnMut(u32, &Req)) {
        let mut page_of = |page: usize, base: *mut Req| {
            if base.is_null() {
                return;
            }
            for i in 0..PAGE {
                // SAFETY: as in `get`: a live page of `PAGE` records.
                f((page * PAGE + i) as u32, unsafe { &*base.add(i) });
            }
        };
        page_of(0, self.first.as_ptr());
        for (segment, dir) in self.segments.iter().enumerate() {
            let dir = dir.load(Ordering::Acquire);
            if dir.is_null() {
                continue;
            }
            for index in 0..1usize << segment {
                // SAFETY: as in `page`.
                let base = unsafe { &*dir.add(index) }.load(Ordering::Acquire);
                page_of((1 << segment) + index, base);
            }
        }
    }
}

impl Drop for Reqs {
    fn drop(&mut self) {
        // SAFETY: allocated by `new` as a page; no borrow outlives `&mut self`.
        unsafe { free(self.first.as_ptr(), PAGE) };
        for (segment, dir) in self.segments.iter_mut().enumerate() {
            let dir = *dir.get_mut();
            if dir.is_null() {
                continue;
            }
            for index in 0..1usize << segment {
                // SAFETY: a live segment of `1 << segment` pointers.
                let page = unsafe { &mut *dir.add(index) }.get_mut();
                if !page.is_null() {
                    // SAFETY: allocated by `grow` as a page.
                    unsafe { free(*page, PAGE) };
                }
            }
            // SAFETY: allocated by `grow` as a segment of this length.
            unsafe { free(dir, 1 << segment) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{generation, inflight, Reqs, ONE, PAGE, PENDING};
    use std::sync::atomic::Ordering;

    /// Records far apart each get their own place, zeroed at first, and keep
    /// what was written; `each` visits every allocated one once.
    #[test]
    fn records_of_low_and_high_slots() {
        let reqs = Reqs::new();
        let slots = [0u32, 1, 1023, 1024, 5000, 1 << 20, (1 << 31) - 1];
        for &s in &slots {
            assert!(reqs.get(s).is_none() || s < PAGE as u32);
            let r = reqs.get_or_grow(s);
            assert_eq!(r.word.load(Ordering::Relaxed), 0, "slot {s}");
            r.word
                .store(u64::from(s) << 32 | PENDING | ONE, Ordering::Relaxed);
        }
        for &s in &slots {
            let w = reqs.get(s).unwrap().word.load(Ordering::Relaxed);
            assert_eq!((generation(w), inflight(w), w & PENDING), (s, 1, PENDING));
        }
        let mut seen = Vec::new();
        reqs.each(|s, r| {
            if r.word.load(Ordering::Relaxed) != 0 {
                seen.push(s);
            }
        });
        seen.sort_unstable();
        assert_eq!(seen, slots);
    }
}
