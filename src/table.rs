//! The registration table: one 16-byte slot and one key per descriptor number.
//!
//! A descriptor number is a small dense integer, so it is the slot's index: a
//! registration's [`Token`] is (descriptor number, incarnation), and finding a
//! registration needs neither a hash map nor a free list. One number has at most
//! one registration: registering a number again reuses its slot (the poller
//! supersedes the old registration first).
//!
//! # A slot
//!
//! Two bytes and two 32-bit words, padded to 16 bytes:
//!
//! - `lock`: the lock bit and the parked bit (see below);
//! - `state`: an occupied bit, the always-ready bit and the phase (fresh, idle,
//!   or armed for one of the seven interests: readable, writable, priority and
//!   their unions);
//! - `generation`: the registration's arming generation; in a vacant slot, the
//!   generation its last registration ended at, where the next one starts, so a
//!   slot's tags do not repeat before 2^32 armings (wrap-around included) and
//!   events still queued for an earlier registration of the number are stale;
//! - `incarnation`: the high half of the registration's token.
//!
//! Beside it, outside the slot, the registration's *key*: the owner's word
//! (`Poller::register_with`), a pointer-sized atomic (see "Keys").
//!
//! The lock is a bit in `lock`: taken by a compare-and-swap from 0 (acquire),
//! released by swapping 0 in (release), as a futex mutex is. It is held across the
//! registration's one kernel command, so a registration's state has one owner at a
//! time and after every completed operation the kernel's view equals the table's. It is contended
//! only by operations on the same registration (an arm racing the delivery of that
//! registration's event); arm, disarm and deliver of different registrations take
//! different locks. A thread that finds it taken spins a few times, then sets the
//! slot's `PARKED` bit and sleeps on one of the table's 16 buckets (a mutex and a
//! condition variable that the slots hash onto); an unlock that finds `PARKED`
//! wakes that bucket. Sleeping, not spinning or yielding, matters: the thread an
//! arm's kernel command wakes to deliver the event often preempts the arming
//! thread on its own processor, and a waiter that spins there keeps the holder
//! from finishing. `state`, `generation` and `incarnation` are atomics read and
//! written with relaxed ordering only under the lock, which orders them: no
//! `unsafe` is needed for the data. The key is one more such atomic, read and
//! written only under the slot's lock.
//!
//! # Where a slot lives
//!
//! Slots live in *chunks* allocated on first use and freed only with the table,
//! so a lookup is lock-free: an acquire load per level, never a lock. Indices below
//! 8,128 are in 127 small chunks of 64 slots each (1.5 KiB with their keys, so a
//! poller with a few low descriptors pays 1.5 KiB), found through an array of
//! their pointers inside the table: a lookup there is the chunk's pointer (index /
//! 64) and the slot's place in the chunk from a 64-entry table made at compile
//! time, with no arithmetic that depends on the chunk. Indices from 8,128 on are
//! in *pages* of 4,096 slots (96 KiB with their keys), found through a directory
//! of 19 segments where segment `s` holds 2^s page pointers. Every pointer at
//! every level is written once (null to an allocation) under `grow` and never
//! changed again until `Drop`. A table whose highest index is `n` holds at most
//! `n + 64` slots below 8,128 and `n + 4096` beyond: 24 bytes per registration
//! (16 for the slot, 8 for the key on 64-bit targets) plus at most 96 KiB,
//! whatever `n` is, with sparse numbers costing a chunk or a page each.
//!
//! # Cache lines
//!
//! Four slots share each 64-byte line. Padding every slot to its own line would
//! cost 64 bytes per registration; instead the slots of one line are numbers far
//! apart: within a chunk of `L` lines, consecutive numbers are two lines (128
//! bytes, the pair the adjacent-line prefetcher fetches together) apart, and the
//! four numbers of one line are `L` apart (`L` is 16 in a small chunk, 1,024 in a
//! page). Numbers opened one after the other (the two ends of a socketpair, a
//! burst of accepted connections handed to different threads) therefore never
//! share a written line.
//!
//! # Keys
//!
//! A chunk is an array of *blocks* of 384 bytes, aligned to 128: four lines of
//! slots (two prefetch pairs) and then the sixteen keys of those slots (two lines,
//! the third pair). A key is written only by `register_with` and `set_key` and
//! read when an event is accepted, so keys of neighbouring numbers share lines
//! without costing each other anything on the hot path, and a pair of lines never
//! mixes the slots' lock words, which every arm writes, with keys. A slot and its
//! key are in one block: an accepted event touches the slot's line and the key's
//! line next to it. Keeping the key out of the slot keeps four slots per line;
//! inside the slot it would make 24-byte slots that straddle lines, or 32-byte
//! ones (past the 32 bytes per registration that the scale bench allows once the
//! last page is counted).

use crate::interest::Interest;
use crate::raw::RawFd;
use crate::state::RegState;
use crate::sync::atomic::{AtomicPtr, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use crate::sync::{Condvar, Mutex};
use crate::token::Token;
use crate::token::MAX_SLOTS;
use std::ops::{Deref, DerefMut};
use std::ptr;
use std::sync::PoisonError;

/// Slots in a small chunk: chunk `c` holds indices `c * FIRST ..= c * FIRST + 63`.
const FIRST: usize = 64;
/// Small chunks.
const SMALL: usize = 127;
/// Slots per page.
const PAGE: usize = 4096;
/// The first index kept in pages: the small chunks hold every index below it.
const PAGED: usize = FIRST * SMALL;
/// Segments of the page directory: segment `s` holds `1 << s` page pointers, so
/// 19 of them hold `2^19 - 1` pages, more than the `(2^31 - PAGED) / PAGE` that
/// every non-negative `i32` descriptor number needs.
const SEGMENTS: usize = 19;
/// Slots per 64-byte line.
const LANES: usize = 4;
/// Lines of slots per [`Block`].
const BLOCK_LINES: usize = 4;
/// Lock attempts spun before sleeping (one under the loom model, so that its
/// interleavings reach the sleeping path).
const SPINS: u32 = if cfg!(all(loom, test)) { 1 } else { 16 };
/// Buckets the waiters for a slot's lock sleep in.
const BUCKETS: usize = 16;

/// Bits of `Slot::lock`: held, and a thread sleeps (or is about to) until it is
/// released.
const LOCKED: u8 = 1;
const PARKED: u8 = 1 << 1;
/// Bits of `Slot::state`: the occupied bit, and the registration's state in the
/// bits `RegState::packed` uses (`state::STATE_BITS`: the always-ready bit, then
/// the phase in four bits, 0 fresh, 8 idle, 1..=7 armed for that
/// [`Interest::bits`](crate::interest::Interest::bits)).
const OCCUPIED: u8 = 1;
const _: () = assert!(OCCUPIED & crate::state::STATE_BITS == 0);

/// A live registration, as the table hands it out under the slot's lock.
pub(crate) struct Entry {
    /// The descriptor number: the slot's index.
    pub(crate) fd: RawFd,
    pub(crate) token: Token,
    pub(crate) state: RegState,
}

/// One slot; see the module docs.
#[derive(Default)]
#[repr(C, align(16))]
struct Slot {
    lock: AtomicU8,
    state: AtomicU8,
    generation: AtomicU32,
    incarnation: AtomicU32,
}

/// Four slots on one 64-byte line.
#[derive(Default)]
#[repr(C, align(64))]
struct Line([Slot; LANES]);

/// The unit chunks are made of: four lines of slots and the sixteen slots' keys,
/// 384 bytes, aligned to the 128-byte pairs of lines the adjacent-line prefetcher
/// fetches together, so that a pair never mixes slots and keys (see "Keys" in the
/// module docs).
#[derive(Default)]
#[repr(C, align(128))]
struct Block {
    lines: [Line; BLOCK_LINES],
    /// The key of the slot in lane `k % LANES` of line `k / LANES`.
    keys: [AtomicUsize; BLOCK_LINES * LANES],
}

// (Loom's atomics are larger: the model checks the protocol, not the layout.)
#[cfg(not(all(loom, test)))]
const _: () = assert!(std::mem::size_of::<Slot>() == 16);
#[cfg(not(all(loom, test)))]
const _: () = assert!(std::mem::size_of::<Line>() == 64);
#[cfg(all(not(all(loom, test)), target_pointer_width = "64"))]
const _: () = assert!(std::mem::size_of::<Block>() == 384);

impl Slot {
    /// Takes the lock if it is free (nobody holds it or waits for it).
    #[inline(always)]
    fn try_lock(&self) -> bool {
        self.lock
            .compare_exchange(0, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }
}

/// Where the waiters for a slot's lock sleep.
#[derive(Default)]
struct Bucket {
    mutex: Mutex<()>,
    wake: Condvar,
}

/// A registration's state as its slot's `state` byte: the occupied bit beside
/// the state's own packing (`RegState::packed`: the always-ready bit and the phase).
#[inline(always)]
fn encode(state: &RegState) -> u8 {
    OCCUPIED | state.packed()
}

#[inline(always)]
fn decode(bits: u8, generation: u32) -> RegState {
    RegState::from_packed(bits, generation)
}

/// A locked slot: its registration (if any) decoded, written back and unlocked
/// when the guard is dropped.
pub(crate) struct SlotGuard<'a> {
    table: &'a Table,
    slot: &'a Slot,
    /// The slot's key: read and written only under the slot's lock.
    key: &'a AtomicUsize,
    entry: Option<Entry>,
    was_occupied: bool,
    /// Where the slot's next registration starts (meaningful while vacant).
    next_generation: u32,
}

impl SlotGuard<'_> {
    /// Sets the key of the slot's registration: seen by every later holder of the
    /// lock (the unlock publishes it).
    #[inline(always)]
    pub(crate) fn set_key(&mut self, key: usize) {
        self.key.store(key, Ordering::Relaxed);
    }

    /// The generation a new registration in this vacant slot starts at: where the
    /// slot's last registration ended.
    pub(crate) fn next_generation(&self) -> u32 {
        self.next_generation
    }

    /// Empties the slot, recording where its registration ended (its generation
    /// now) as the start of the next one. Returns the registration.
    pub(crate) fn vacate(&mut self) -> Option<Entry> {
        let entry = self.entry.take()?;
        self.next_generation = entry.state.generation();
        Some(entry)
    }
}

impl Deref for SlotGuard<'_> {
    type Target = Option<Entry>;
    #[inline(always)]
    fn deref(&self) -> &Option<Entry> {
        &self.entry
    }
}

impl DerefMut for SlotGuard<'_> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Option<Entry> {
        &mut self.entry
    }
}

impl Drop for SlotGuard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        let bits = match &self.entry {
            Some(e) => {
                self.slot
                    .generation
                    .store(e.state.generation(), Ordering::Relaxed);
                self.slot
                    .incarnation
                    .store(e.token.incarnation(), Ordering::Relaxed);
                encode(&e.state)
            }
            None => {
                self.slot
                    .generation
                    .store(self.next_generation, Ordering::Relaxed);
                0
            }
        };
        match (self.was_occupied, self.entry.is_some()) {
            (false, true) => drop(self.table.counts.live.fetch_add(1, Ordering::Relaxed)),
            (true, false) => drop(self.table.counts.live.fetch_sub(1, Ordering::Relaxed)),
            _ => {}
        }
        self.slot.state.store(bits, Ordering::Relaxed);
        self.table.unlock(self.slot);
    }
}

/// A slot's lock, held: released on drop ([`Table::lock_slot`]).
struct Held<'a> {
    table: &'a Table,
    slot: &'a Slot,
}

impl Drop for Held<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.table.unlock(self.slot);
    }
}

/// A live registration's slot, locked ([`Table::live`]): its state as it was
/// when locked; [`store`](Self::store) writes a new one; dropping it unlocks.
pub(crate) struct Live<'a> {
    held: Held<'a>,
    /// The registration's state.
    pub(crate) state: RegState,
}

impl Live<'_> {
    /// Writes [`state`](Self::state) back to the slot (seen by the next holder
    /// of the lock).
    #[inline(always)]
    pub(crate) fn store(&self) {
        let slot = self.held.slot;
        slot.generation
            .store(self.state.generation(), Ordering::Relaxed);
        slot.state.store(encode(&self.state), Ordering::Relaxed);
    }
}

/// What [`Table::deliver`] did with a kernel event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// Current, and it completed the registration's arming (now idle), which
    /// was for this interest: `deliver`'s `taken` had it delivered.
    Taken { token: Token, interest: Interest },
    /// Current (the stamp names this registration), but no arming was left to
    /// complete: on kqueue, the other filter of a delivery already taken.
    Current(Token),
    /// No live registration in the slot, or the stamp is not current: dropped.
    Stale,
}

/// The table. See the module docs.
pub(crate) struct Table {
    /// Small chunk `c`: `FIRST` slots, as `FIRST / SLOTS_PER_BLOCK` blocks.
    small: [AtomicPtr<Block>; SMALL],
    /// Directory segment `s`: `1 << s` page pointers, each to
    /// `PAGE / SLOTS_PER_BLOCK` blocks.
    segments: [AtomicPtr<AtomicPtr<Block>>; SEGMENTS],
    /// Serialises allocation: every pointer above is written once, under it.
    grow: Mutex<()>,
    /// Waiters for slot locks (see the module docs).
    buckets: [Bucket; BUCKETS],
    /// Written by register and deregister: on lines of their own, so that they
    /// do not move the lines every lookup reads (the pointers above).
    counts: Counts,
}

#[derive(Default)]
#[repr(align(128))]
struct Counts {
    /// Occupied slots.
    live: AtomicUsize,
    /// Bytes allocated for chunks, pages and segments.
    heap: AtomicUsize,
}

/// Where index `i` lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Small chunk `.0`, slot `.1` in it.
    Small(usize, usize),
    /// Segment `.0`, page pointer `.1` in it, slot `.2` in the page.
    Paged(usize, usize, usize),
}

/// `floor(log2(n))` for `n >= 1`.
#[inline(always)]
fn log2(n: usize) -> usize {
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

#[inline(always)]
fn place(index: usize) -> Place {
    if index < PAGED {
        Place::Small(index / FIRST, index % FIRST)
    } else {
        let rest = index - PAGED;
        let n = rest / PAGE + 1;
        let segment = log2(n);
        Place::Paged(segment, n - (1 << segment), rest % PAGE)
    }
}

/// Slot `offset` of a chunk of `1 << line_bits` lines at `base`, and its key (see
/// "Cache lines" in the module docs: consecutive offsets two lines apart, the
/// lanes of one line `1 << line_bits` apart; line `l` is line `l % BLOCK_LINES` of
/// block `l / BLOCK_LINES`).
///
/// # Safety
/// `base` points to a live allocation of `(1 << line_bits) / BLOCK_LINES` blocks
/// (`line_bits >= 2`) that outlives `'a`, and `offset < LANES << line_bits`.
#[inline(always)]
unsafe fn slot_at<'a>(
    base: *const Block,
    line_bits: u32,
    offset: usize,
) -> (&'a Slot, &'a AtomicUsize) {
    // `offset` is the lane (its top two bits) above `low` (`line_bits` bits);
    // the slot's position in the chunk, in slots, is `line << 2 | lane`, where
    // `line` is `low` rotated left by one within `line_bits`. Worked out in one
    // go: `low`'s bits but the top one go to bits 3 and up; the three bits at
    // `line_bits - 1` (lane and `low`'s top bit, `[l1 l0 h]`) become `[h l1 l0]`.
    // (`[l1 l0 h]` times 9 is `[l1 l0 h l1 l0 h]`: shifted right once, its low
    // three bits are `[h l1 l0]`.)
    let pos = position(offset, LANES << line_bits, line_bits - 1);
    // SAFETY: as `slot_in` requires: `pos` < `LANES << line_bits` (a
    // permutation of the offsets), the slots allocated at `base`.
    unsafe { slot_in(base, pos) }
}

/// The position, in slots, of `offset` in a chunk of `size` slots (`LANES <<
/// line_bits`), `top_shift` being `line_bits - 1` (see [`slot_at`]).
#[inline(always)]
const fn position(offset: usize, size: usize, top_shift: u32) -> usize {
    let top = offset >> top_shift;
    ((offset << 3) & (size - 1)) | (((top * 9) >> 1) & 7)
}

/// The slot at position `pos` of the chunk at `base`, and its key.
///
/// # Safety
/// `base` points to a live allocation of more than `pos` slots (`pos /
/// SLOTS_PER_BLOCK` blocks and then some) that outlives `'a`.
#[inline(always)]
unsafe fn slot_in<'a>(base: *const Block, pos: usize) -> (&'a Slot, &'a AtomicUsize) {
    // SAFETY: `pos / SLOTS_PER_BLOCK` is below the blocks allocated, which live
    // for `'a` (the caller's promise).
    let block = unsafe { &*base.add(pos / SLOTS_PER_BLOCK) };
    // A block's lines of slots are consecutive: slot `s` of the block is lane
    // `s % LANES` of line `s / LANES`, and its key is key `s`.
    let s = pos % SLOTS_PER_BLOCK;
    let lines: *const Slot = block.lines.as_ptr().cast();
    // SAFETY: `Block` and `Line` are `repr(C)`, `lines` first: the block's
    // `BLOCK_LINES * LANES` slots are one array there, and `s` is below that.
    (unsafe { &*lines.add(s) }, &block.keys[s])
}

/// `log2` of the lines in a small chunk.
const SMALL_LINE_BITS: u32 = (FIRST / LANES).trailing_zeros();

/// Where offset `o` of a small chunk lives, in bytes from the chunk's start:
/// [`slot_at`]'s slot (`.0`) and key (`.1`), worked out at compile time, so that a
/// lookup below `PAGED` is one load of the chunk's pointer and one of this table
/// (128 bytes each, on lines every lookup reads).
const SMALL_PLACES: ([u16; FIRST], [u16; FIRST]) = {
    let mut slots = [0u16; FIRST];
    let mut keys = [0u16; FIRST];
    let mut o = 0;
    while o < FIRST {
        let pos = position(o, FIRST, SMALL_LINE_BITS - 1);
        let block = pos / SLOTS_PER_BLOCK * std::mem::size_of::<Block>();
        let s = pos % SLOTS_PER_BLOCK;
        slots[o] = (block + s * std::mem::size_of::<Slot>()) as u16;
        keys[o] = (block
            + BLOCK_LINES * std::mem::size_of::<Line>()
            + s * std::mem::size_of::<AtomicUsize>()) as u16;
        o += 1;
    }
    (slots, keys)
};
/// `log2` of the lines in a page.
const PAGE_LINE_BITS: u32 = (PAGE / LANES).trailing_zeros();

/// Slots per [`Block`].
const SLOTS_PER_BLOCK: usize = BLOCK_LINES * LANES;

/// Blocks for `slots` slots, default (every slot vacant, generation 0, key 0), as
/// a raw pointer owned by the caller (freed by `free_blocks(p, slots)`).
fn new_blocks(slots: usize) -> *mut Block {
    let blocks: Box<[Block]> = (0..slots / SLOTS_PER_BLOCK)
        .map(|_| Block::default())
        .collect();
    Box::into_raw(blocks).cast::<Block>()
}

/// Bytes of the blocks for `slots` slots.
const fn blocks_bytes(slots: usize) -> usize {
    slots / SLOTS_PER_BLOCK * std::mem::size_of::<Block>()
}

/// # Safety
/// `p` came from `new_blocks(slots)` and is freed only here, once.
unsafe fn free_blocks(p: *mut Block, slots: usize) {
    let n = slots / SLOTS_PER_BLOCK;
    // SAFETY: the caller's promise: `p` is `Box<[Block]>::into_raw` of `n` blocks.
    drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(p, n)) });
}

impl Table {
    pub(crate) fn new() -> Table {
        Table {
            small: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            segments: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            grow: Mutex::new(()),
            buckets: Default::default(),
            counts: Counts::default(),
        }
    }

    /// Slot `index`, if it was ever allocated (it was for every index a
    /// registration was made at). Lock-free: one acquire load for indices below
    /// 8,128, two beyond.
    #[inline(always)]
    fn get(&self, index: usize) -> Option<(&Slot, &AtomicUsize)> {
        // (The small chunks first: below `PAGED`, `index` is below `MAX_SLOTS`
        // too, and needs no second compare.)
        const _: () = assert!(PAGED < MAX_SLOTS);
        if index < PAGED {
            let base = self.small[index / FIRST].load(Ordering::Acquire);
            if base.is_null() {
                return None;
            }
            let o = index % FIRST;
            let (slots, keys) = &SMALL_PLACES;
            // SAFETY: a non-null small-chunk pointer was stored (release, read
            // here with acquire, so the blocks' initialisation is visible) by
            // `slot_for_insert` from `new_blocks(FIRST)`, and `SMALL_PLACES` holds
            // `slot_at`'s offsets within such a chunk (its slot, its key: in
            // bounds, aligned, of those types; checked against `slot_at` by
            // `lookup_of_every_small_index_is_place_and_slot_at`). It is freed
            // only by `drop`, which needs `&mut self`, so it outlives this borrow
            // of `self`.
            return Some(unsafe {
                let bytes = base.cast::<u8>();
                (
                    &*bytes.add(slots[o] as usize).cast::<Slot>(),
                    &*bytes.add(keys[o] as usize).cast::<AtomicUsize>(),
                )
            });
        }
        if index >= MAX_SLOTS {
            return None;
        }
        match place(index) {
            Place::Small(..) => None,
            Place::Paged(segment, page, offset) => {
                let dir = self.segments.get(segment)?.load(Ordering::Acquire);
                if dir.is_null() {
                    return None;
                }
                // SAFETY: a non-null segment pointer came from a boxed slice of
                // `1 << segment` page pointers (`slot_for_insert`), published with
                // release and freed only by `drop` (`&mut self`); `page` is below
                // `1 << segment` by `place`.
                let base = unsafe { &*dir.add(page) }.load(Ordering::Acquire);
                if base.is_null() {
                    return None;
                }
                // SAFETY: as for a small chunk: a page is `new_blocks` of `PAGE`
                // slots, published with release, freed only by `drop`; `offset` is
                // below `PAGE` by `place`.
                Some(unsafe { slot_at(base, PAGE_LINE_BITS, offset) })
            }
        }
    }

    /// Locks slot `index`, or `None` if no registration was ever made there (then
    /// none is live there either). Lock-free lookup; the lock is the slot's own.
    #[inline(always)]
    pub(crate) fn lock(&self, index: usize) -> Option<SlotGuard<'_>> {
        let (slot, key) = self.get(index)?;
        Some(self.guard(index, slot, key))
    }

    /// The event path: locks slot `index` once, and if its registration is live
    /// and `current(generation, token)` says the event's stamp names it, runs the
    /// state machine's [`RegState::on_event`] and writes the new state back;
    /// when that completes an arming, calls `taken(token, interest, key)` (the
    /// caller's push of the event) before unlocking. Unlike [`lock`](Self::lock),
    /// it touches only the state byte it may change (and the key it reads), and
    /// builds no guard.
    #[inline(always)]
    pub(crate) fn deliver(
        &self,
        index: usize,
        current: impl FnOnce(u32, Token) -> bool,
        taken: impl FnOnce(Token, Interest, usize),
    ) -> Delivery {
        let Some((slot, key)) = self.get(index) else {
            return Delivery::Stale;
        };
        let _held = self.lock_slot(slot);
        let bits = slot.state.load(Ordering::Relaxed);
        if bits & OCCUPIED == 0 {
            Delivery::Stale
        } else {
            let generation = slot.generation.load(Ordering::Relaxed);
            let token = Token::new(index as u32, slot.incarnation.load(Ordering::Relaxed));
            if !current(generation, token) {
                Delivery::Stale
            } else {
                let mut state = decode(bits, generation);
                // Current: the arming in force, if any, is the one the event
                // completes (the stamp was checked against it above).
                match state.on_event(None) {
                    Some(interest) => {
                        // `on_event` changes the phase only, not the generation.
                        slot.state.store(encode(&state), Ordering::Relaxed);
                        taken(token, interest, key.load(Ordering::Relaxed));
                        Delivery::Taken { token, interest }
                    }
                    None => Delivery::Current(token),
                }
            }
        }
    }

    /// The operation path (arm, disarm): locks the slot `token` names if its
    /// registration is `token`'s (`None` otherwise, unlocked again), and hands
    /// out its state. Like [`deliver`](Self::deliver), it builds no guard: one
    /// table access, the slot's own lock, and the state's two words, written
    /// back by [`Live::store`].
    #[inline(always)]
    pub(crate) fn live(&self, token: Token) -> Option<Live<'_>> {
        let (slot, _) = self.get(token.index())?;
        let held = self.lock_slot(slot);
        let bits = slot.state.load(Ordering::Relaxed);
        if bits & OCCUPIED == 0 || slot.incarnation.load(Ordering::Relaxed) != token.incarnation() {
            return None;
        }
        let state = decode(bits, slot.generation.load(Ordering::Relaxed));
        Some(Live { held, state })
    }

    /// Takes `slot`'s lock; the lock is released when the returned value is
    /// dropped (also on unwinding).
    #[inline(always)]
    fn lock_slot<'a>(&'a self, slot: &'a Slot) -> Held<'a> {
        if !slot.try_lock() {
            self.lock_contended(slot);
        }
        Held { table: self, slot }
    }

    /// Releases `slot`'s lock, held by this thread: publishes the slot's stores
    /// to the next holder (acquire), and wakes the threads sleeping for it.
    #[inline(always)]
    fn unlock(&self, slot: &Slot) {
        if slot.lock.swap(0, Ordering::Release) & PARKED != 0 {
            self.wake(slot);
        }
    }

    /// Locks slot `index` for a new registration, allocating its chunk (or page)
    /// first if needed. `None` when `index` is at or past [`MAX_SLOTS`].
    pub(crate) fn lock_for_insert(&self, index: usize) -> Option<SlotGuard<'_>> {
        let (slot, key) = match self.get(index) {
            Some(found) => found,
            None if index < MAX_SLOTS => self.slot_for_insert(index),
            None => return None,
        };
        Some(self.guard(index, slot, key))
    }

    #[inline(always)]
    fn guard<'a>(&'a self, index: usize, slot: &'a Slot, key: &'a AtomicUsize) -> SlotGuard<'a> {
        if !slot.try_lock() {
            self.lock_contended(slot);
        }
        self.guard_locked(index, slot, key)
    }

    fn bucket(&self, slot: &Slot) -> &Bucket {
        &self.buckets[(slot as *const Slot as usize / std::mem::size_of::<Slot>()) % BUCKETS]
    }

    /// Takes `slot`'s lock, held by another thread: spins briefly, then sleeps
    /// until an unlock wakes it.
    #[cold]
    fn lock_contended(&self, slot: &Slot) {
        let mut spins = 0;
        loop {
            // Taken without `PARKED` even if others sleep: the unlock that let
            // this thread in woke them all, and those that find it held again set
            // `PARKED` again.
            if slot.try_lock() {
                return;
            }
            let word = slot.lock.load(Ordering::Relaxed);
            if word & LOCKED == 0 {
                continue;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            if word & PARKED == 0
                && slot
                    .lock
                    .compare_exchange_weak(
                        word,
                        word | PARKED,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    )
                    .is_err()
            {
                continue;
            }
            let bucket = self.bucket(slot);
            let held = bucket.mutex.lock().unwrap_or_else(PoisonError::into_inner);
            // An unlock clears `PARKED` and then takes this mutex to notify: seen
            // set here, under the mutex, the notify comes after this wait begins.
            if slot.lock.load(Ordering::Relaxed) == LOCKED | PARKED {
                drop(
                    bucket
                        .wake
                        .wait(held)
                        .unwrap_or_else(PoisonError::into_inner),
                );
            }
        }
    }

    /// Wakes the threads sleeping on `slot`'s bucket (an unlock found `PARKED`).
    #[cold]
    fn wake(&self, slot: &Slot) {
        let bucket = self.bucket(slot);
        let _held = bucket.mutex.lock().unwrap_or_else(PoisonError::into_inner);
        bucket.wake.notify_all();
    }

    /// The guard for `slot`, whose lock the caller holds (or whose table the
    /// caller has exclusive access to).
    #[inline(always)]
    fn guard_locked<'a>(
        &'a self,
        index: usize,
        slot: &'a Slot,
        key: &'a AtomicUsize,
    ) -> SlotGuard<'a> {
        let bits = slot.state.load(Ordering::Relaxed);
        let generation = slot.generation.load(Ordering::Relaxed);
        let occupied = bits & OCCUPIED != 0;
        let entry = occupied.then(|| Entry {
            fd: crate::raw::fd_at(index),
            token: Token::new(index as u32, slot.incarnation.load(Ordering::Relaxed)),
            state: decode(bits, generation),
        });
        SlotGuard {
            table: self,
            slot,
            key,
            entry,
            was_occupied: occupied,
            next_generation: generation,
        }
    }

    /// Allocates what slot `index` (below `MAX_SLOTS`) lives in, under `grow`.
    #[cold]
    fn slot_for_insert(&self, index: usize) -> (&Slot, &AtomicUsize) {
        let _grow = self.grow.lock().unwrap_or_else(PoisonError::into_inner);
        match place(index) {
            Place::Small(chunk, _) => {
                let p = &self.small[chunk];
                if p.load(Ordering::Acquire).is_null() {
                    p.store(new_blocks(FIRST), Ordering::Release);
                    self.count(blocks_bytes(FIRST));
                }
            }
            Place::Paged(segment, page, _) => {
                let s = &self.segments[segment];
                if s.load(Ordering::Acquire).is_null() {
                    let dir: Box<[AtomicPtr<Block>]> = (0..1usize << segment)
                        .map(|_| AtomicPtr::new(ptr::null_mut()))
                        .collect();
                    s.store(Box::into_raw(dir).cast(), Ordering::Release);
                    self.count((1 << segment) * std::mem::size_of::<AtomicPtr<Block>>());
                }
                // SAFETY: the segment is non-null now (stored above or before, under
                // `grow`, which this thread holds), of `1 << segment` pointers by
                // `slot_for_insert`, `page` below that by `place`, freed only by
                // `drop`.
                let p = unsafe { &*s.load(Ordering::Acquire).add(page) };
                if p.load(Ordering::Acquire).is_null() {
                    p.store(new_blocks(PAGE), Ordering::Release);
                    self.count(blocks_bytes(PAGE));
                }
            }
        }
        self.get(index)
            .expect("the slot's chunk was just allocated")
    }

    fn count(&self, bytes: usize) {
        self.counts.heap.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Occupied slots: live registrations.
    pub(crate) fn len(&self) -> usize {
        self.counts.live.load(Ordering::Relaxed)
    }

    /// Bytes the table allocated (chunks, pages, directory segments).
    #[allow(dead_code)]
    pub(crate) fn heap_bytes(&self) -> usize {
        self.counts.heap.load(Ordering::Relaxed)
    }

    /// Calls `f` on every live registration, through exclusive access, and
    /// makes the table usable in a child process after fork(2). Stops at the
    /// first error.
    ///
    /// A thread that held a slot's lock (or `grow`, or a bucket's mutex) when
    /// another thread forked does not exist in the child, so its lock would never
    /// be released there: with `&mut self` no other thread of this process can
    /// reach the table, so the slot locks are not taken but cleared (a slot's
    /// contents are those from before the interrupted operation, which wrote
    /// nothing until the kernel answered), and the mutexes are replaced.
    pub(crate) fn try_for_each_after_fork<E>(
        &mut self,
        mut f: impl FnMut(&mut Entry) -> Result<(), E>,
    ) -> Result<(), E> {
        // The old mutexes and condition variables: see `replace_inherited`.
        crate::fork::replace_inherited(&mut self.grow, Mutex::new(()));
        crate::fork::replace_inherited(&mut self.buckets, Default::default());
        let mut index = 0;
        while index < MAX_SLOTS {
            // A missing chunk or page holds no registration: skip it whole.
            let Some(mut guard) = self.get(index).map(|(slot, key)| {
                slot.lock.store(LOCKED, Ordering::Relaxed);
                self.guard_locked(index, slot, key)
            }) else {
                index = match place(index) {
                    Place::Small(chunk, _) => FIRST * (chunk + 1),
                    Place::Paged(..) => PAGED + ((index - PAGED) / PAGE + 1) * PAGE,
                };
                continue;
            };
            if let Some(entry) = guard.as_mut() {
                f(entry)?;
            }
            index += 1;
        }
        Ok(())
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        for p in self.small.iter_mut() {
            // `&mut self`: no other access; a relaxed load reads the last store.
            let base = p.load(Ordering::Relaxed);
            if !base.is_null() {
                // SAFETY: stored by `slot_for_insert` from `new_blocks` of exactly
                // this many slots; freed only here, once.
                unsafe { free_blocks(base, FIRST) };
            }
        }
        for (segment, s) in self.segments.iter_mut().enumerate() {
            let dir = s.load(Ordering::Relaxed);
            if dir.is_null() {
                continue;
            }
            let len = 1usize << segment;
            // SAFETY: `dir` is `Box<[AtomicPtr<Block>]>::into_raw` of `len` pointers
            // (`slot_for_insert`), taken back once, here.
            let mut dir = unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(dir, len)) };
            for page in dir.iter_mut() {
                let base = page.load(Ordering::Relaxed);
                if !base.is_null() {
                    // SAFETY: a page from `new_blocks(PAGE)`, freed only here.
                    unsafe { free_blocks(base, PAGE) };
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
