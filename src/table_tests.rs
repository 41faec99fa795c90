//! The table's unit tests (`src/table.rs`): where each index's slot and key are
//! placed and how a lookup finds them, allocation on insert and the heap a table
//! holds, the state's round trip through a slot, generations across
//! registrations, the slot lock across threads, and the walk after a fork.

use super::*;
use crate::state::Phase;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashSet;

/// Counts the bytes this thread holds from the heap (tests run on several
/// threads at once; each counts its own).
struct Counting;

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator unchanged; the counter is a
// thread-local `Cell` with no destructor, which allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = HELD.try_with(|h| h.set(h.get() + layout.size() as isize));
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        let _ = HELD.try_with(|h| h.set(h.get() - layout.size() as isize));
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(p, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn held() -> isize {
    HELD.with(Cell::get)
}

/// Registers `index` as the poller does (incarnation `inc`); returns the token.
fn register(table: &Table, index: usize, inc: u32) -> Token {
    let mut g = table.lock_for_insert(index).expect("below MAX_SLOTS");
    assert!(g.is_none(), "slot {index} is vacant");
    let token = Token::new(index as u32, inc);
    *g = Some(Entry {
        fd: crate::raw::fd_at(index),
        token,
        state: RegState::new(g.next_generation()),
    });
    token
}

#[test]
fn place_covers_indices_without_gaps_or_overlap() {
    let mut expect = Place::Small(0, 0);
    for index in 0..PAGED + 3 * PAGE {
        assert_eq!(place(index), expect, "index {index}");
        expect = match expect {
            Place::Small(c, o) if o + 1 < FIRST => Place::Small(c, o + 1),
            Place::Small(c, _) if c + 1 < SMALL => Place::Small(c + 1, 0),
            Place::Small(..) => Place::Paged(0, 0, 0),
            Place::Paged(s, p, o) if o + 1 < PAGE => Place::Paged(s, p, o + 1),
            Place::Paged(s, p, _) if p + 1 < 1 << s => Place::Paged(s, p + 1, 0),
            Place::Paged(s, ..) => Place::Paged(s + 1, 0, 0),
        };
    }
    // The largest descriptor number has a place in the directory.
    match place(i32::MAX as usize) {
        Place::Paged(s, p, o) => assert!(s < SEGMENTS && p < 1 << s && o < PAGE),
        other => panic!("{other:?}"),
    }
}

/// The blocks of a chunk (or page) of `slots` slots, every slot vacant.
fn chunk_of(slots: usize) -> Vec<Block> {
    (0..slots / SLOTS_PER_BLOCK)
        .map(|_| Block::default())
        .collect()
}

/// `slot_at`'s one-go position is the layout the module docs describe:
/// line `rotl1(low)` (within `line_bits`), lane `offset >> line_bits`.
#[test]
fn slot_at_places_each_offset_on_its_rotated_line_and_lane() {
    for (bits, slots) in [(SMALL_LINE_BITS, FIRST), (PAGE_LINE_BITS, PAGE)] {
        let blocks = chunk_of(slots);
        let base = blocks.as_ptr();
        let mask = (1usize << bits) - 1;
        for o in 0..slots {
            let low = o & mask;
            let line = ((low << 1) & mask) | (low >> (bits - 1));
            let lane = o >> bits;
            let b = &blocks[line / BLOCK_LINES];
            // SAFETY: `blocks` holds `1 << bits` lines and outlives the borrow.
            let (slot, key) = unsafe { slot_at(base, bits, o) };
            assert!(
                ptr::eq(slot, &b.lines[line % BLOCK_LINES].0[lane]),
                "{slots} {o}"
            );
            assert!(ptr::eq(key, &b.keys[(line % BLOCK_LINES) * LANES + lane]));
        }
    }
}

/// `get`'s small-chunk path (the chunk's pointer and `SMALL_PLACES`) finds what
/// `place` and `slot_at` name, for every index below `PAGED`.
#[test]
fn lookup_of_every_small_index_is_place_and_slot_at() {
    let table = Table::new();
    for chunk in 0..SMALL {
        drop(table.lock_for_insert(FIRST * chunk));
    }
    for index in 0..PAGED {
        let Place::Small(chunk, offset) = place(index) else {
            panic!("{index}")
        };
        let base = table.small[chunk].load(Ordering::Acquire);
        // SAFETY: chunk `chunk` is allocated above and lives with `table`.
        let want = unsafe { slot_at(base, SMALL_LINE_BITS, offset) };
        let (slot, key) = table.get(index).unwrap();
        assert!(ptr::eq(slot, want.0) && ptr::eq(key, want.1), "{index}");
    }
}

#[test]
fn every_slot_of_a_chunk_is_distinct_and_neighbours_share_no_line() {
    for (bits, slots) in [(SMALL_LINE_BITS, FIRST), (PAGE_LINE_BITS, PAGE)] {
        let blocks = chunk_of(slots);
        let base = blocks.as_ptr();
        let mut seen = HashSet::new();
        let mut keys = HashSet::new();
        let mut prev: Option<usize> = None;
        for o in 0..slots {
            // SAFETY: `blocks` holds `1 << bits` lines and outlives the borrow.
            let (slot, key) = unsafe { slot_at(base, bits, o) };
            let (s, k) = (slot as *const Slot as usize, key as *const _ as usize);
            assert!(seen.insert(s), "offset {o} maps onto another slot");
            assert!(keys.insert(k), "offset {o} maps onto another key");
            // The slot and its key are in the same block, in different
            // 128-byte pairs of lines.
            let block = |a: usize| (a - base as usize) / std::mem::size_of::<Block>();
            assert_eq!(block(s), block(k), "offset {o}");
            let pair = (s - base as usize) / 128;
            assert_ne!(pair, (k - base as usize) / 128, "offset {o}");
            if let Some(p) = prev {
                // Consecutive numbers: neither the same line nor its 128-byte
                // neighbour.
                assert_ne!(pair, p, "offsets {} and {o}", o - 1);
            }
            prev = Some(pair);
        }
        assert_eq!(seen.len(), slots);
    }
}

#[test]
fn slots_are_allocated_on_insert_and_found_after() {
    let table = Table::new();
    assert!(table.lock(0).is_none());
    for index in [
        0,
        63,
        64,
        191,
        192,
        5000,
        PAGED - 1,
        PAGED,
        PAGED + PAGE,
        // 2^20 on 64-bit targets; on 32-bit ones the highest number they can
        // register, 2^20 - 1.
        (1 << 20).min(MAX_SLOTS - 1),
    ] {
        register(&table, index, 7);
        let g = table.lock(index).expect("allocated");
        let e = g.as_ref().expect("occupied");
        assert_eq!((crate::raw::slot_of(e.fd), e.token.index()), (index, index));
        assert_eq!(e.token.incarnation(), 7);
    }
    assert_eq!(table.len(), 10);
    // Index 10,000 is in the first page (allocated for PAGED): allocated, vacant.
    assert!(table.lock(10_000).unwrap().is_none());
    assert!(table.lock(PAGED + 5 * PAGE).is_none());
    assert!(table.lock(MAX_SLOTS).is_none());
    assert!(table.lock_for_insert(MAX_SLOTS).is_none());
    assert!(table.lock(u32::MAX as usize).is_none());
    // Every non-negative `i32` on 64-bit targets; 20 bits on 32-bit ones (the
    // kqueue tag's slot bits, `token::SLOT_BITS_32`).
    let want: usize = if cfg!(target_pointer_width = "64") {
        1 << 31
    } else {
        1 << 20
    };
    assert_eq!(MAX_SLOTS, want);
}

#[test]
fn state_round_trips_through_the_slot() {
    let table = Table::new();
    let token = register(&table, 42, 3);
    for phase in [Phase::Fresh, Phase::Idle]
        .into_iter()
        .chain(Interest::ALL.map(Phase::Armed))
    {
        for always_ready in [false, true] {
            for generation in [0, 1, u32::MAX] {
                let state = RegState::from_parts(phase, generation, always_ready);
                table.lock(42).unwrap().as_mut().unwrap().state = state;
                let g = table.lock(42).unwrap();
                let e = g.as_ref().unwrap();
                assert_eq!((e.state, e.token), (state, token));
            }
        }
    }
}

/// A reused slot continues its generation where the last registration ended,
/// across the wrap-around, and superseding (vacate, then register) does too.
#[test]
fn generations_continue_per_slot_and_wrap() {
    let table = Table::new();
    register(&table, 9, 0);
    table.lock(9).unwrap().as_mut().unwrap().state =
        RegState::from_parts(Phase::Armed(Interest::READABLE), u32::MAX - 1, false);
    {
        let mut g = table.lock(9).unwrap();
        let mut e = g.vacate().unwrap();
        assert_eq!(e.state.generation(), u32::MAX - 1);
        // What the poller does: the deregister bumps the generation, recorded
        // as where the next registration starts.
        let _ = e.state.deregister(&mut NoKernel);
        *g = Some(e);
        g.vacate();
    }
    assert_eq!(table.len(), 0);
    let g = table.lock(9).unwrap();
    assert!(g.is_none());
    assert_eq!(g.next_generation(), u32::MAX);
    drop(g);
    register(&table, 9, 1);
    {
        let mut g = table.lock(9).unwrap();
        let e = g.as_mut().unwrap();
        assert_eq!((e.state.generation(), e.token.incarnation()), (u32::MAX, 1));
        let mut fb = crate::state::Fallbacks::default();
        e.state.arm(Interest::BOTH, &mut NoKernel, &mut fb).unwrap();
        assert_eq!(e.state.generation(), 0, "wrapped");
    }
    // Superseding: the same slot, a new incarnation, the generation continued.
    {
        let mut g = table.lock(9).unwrap();
        let mut e = g.vacate().unwrap();
        let _ = e.state.deregister(&mut NoKernel);
        *g = Some(e);
        g.vacate();
        *g = Some(Entry {
            fd: 9,
            token: Token::new(9, 2),
            state: RegState::new(g.next_generation()),
        });
    }
    let g = table.lock(9).unwrap();
    let e = g.as_ref().unwrap();
    assert_eq!((e.state.generation(), e.token.incarnation()), (1, 2));
    assert_eq!(table.len(), 1);
}

/// A kernel that accepts every command.
struct NoKernel;
impl crate::state::Kernel for NoKernel {
    fn add(&mut self, _: Interest, _: u32) -> Result<(), crate::state::KernelError> {
        Ok(())
    }
    fn modify(&mut self, _: Interest, _: u32) -> Result<(), crate::state::KernelError> {
        Ok(())
    }
    fn quiet(&mut self, _: u32) -> Result<(), crate::state::KernelError> {
        Ok(())
    }
    fn delete(&mut self) -> Result<(), crate::state::KernelError> {
        Ok(())
    }
}

#[test]
fn lock_serialises_one_slot_across_threads() {
    let table = Table::new();
    register(&table, 100, 0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..10_000 {
                    let mut g = table.lock(100).unwrap();
                    let e = g.as_mut().unwrap();
                    // A non-atomic read-modify-write under the lock.
                    let n = e.state.generation();
                    e.state = RegState::from_parts(Phase::Idle, n + 1, false);
                }
            });
        }
    });
    let g = table.lock(100).unwrap();
    assert_eq!(g.as_ref().unwrap().state.generation(), 40_000);
}

/// The slots `try_for_each_after_fork` visits, in its order.
fn slots_after_fork(table: &mut Table) -> Vec<usize> {
    let mut got = Vec::new();
    table
        .try_for_each_after_fork(|e| {
            got.push(crate::raw::slot_of(e.fd));
            Ok::<(), ()>(())
        })
        .unwrap();
    got
}

#[test]
fn try_for_each_after_fork_visits_every_live_registration_once() {
    let mut table = Table::new();
    // The last number: 3 * 2^20 on 64-bit targets, past what 32-bit ones can
    // register, so there the highest they can, 2^20 - 1.
    let high = (3 << 20).min(MAX_SLOTS - 1);
    let want: Vec<usize> = vec![0, 5, 63, 64, 4000, PAGED, PAGED + 3 * PAGE + 1, high];
    for &i in &want {
        register(&table, i, 0);
    }
    let got = slots_after_fork(&mut table);
    assert_eq!(got, want);
    assert_eq!(table.try_for_each_after_fork(|_| Err(1)), Err(1));
}

/// A lock held at fork time by a thread the child does not have (here: a
/// guard forgotten) is cleared, not waited for.
#[test]
fn try_for_each_after_fork_clears_locks_of_vanished_threads() {
    let mut table = Table::new();
    register(&table, 3, 0);
    register(&table, 4, 0);
    std::mem::forget(table.lock(3).unwrap());
    let got = slots_after_fork(&mut table);
    assert_eq!(got, [3, 4]);
    assert!(table.lock(3).unwrap().is_some(), "unlocked again");
    register(&table, PAGED, 0); // `grow` works
}

/// The memory target, on descriptor numbers faked where a process
/// could not open that many: 1,000,000 registrations in 24 bytes each (a slot
/// and its key) plus at most one page, counted both by the table and by this
/// thread's allocator.
#[test]
fn a_million_registrations_cost_at_most_32_bytes_each() {
    for n in [18_000usize, 1_000_000] {
        let before = held();
        let table = Table::new();
        for i in 0..n {
            register(&table, i, i as u32);
        }
        let bytes = (held() - before) as usize;
        assert_eq!(table.len(), n);
        let per = bytes as f64 / n as f64;
        assert!(
            per <= 32.0,
            "{n} registrations: {bytes} bytes, {per:.1} per registration"
        );
        assert!(bytes <= 24 * n + 24 * PAGE + 4096, "{n}: {bytes} bytes");
        assert_eq!(table.heap_bytes(), bytes, "the table's own count");
        // Every registration is found again, with its own token.
        for i in (0..n).step_by(997) {
            let g = table.lock(i).unwrap();
            assert_eq!(g.as_ref().unwrap().token, Token::new(i as u32, i as u32));
        }
        drop(table);
        assert_eq!(held(), before, "everything freed");
        // (Printing allocates: only after the counts.)
        eprintln!("{n} registrations: {bytes} bytes, {per:.2} per registration");
    }
}
