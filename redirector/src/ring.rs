//! The fixed ring between the request handlers and the drain task, in the state region (memory
//! that can outlive the process: see `state`).
//!
//! A bounded queue of fixed-size slots with the code stored inline (Vyukov's bounded queue, as
//! `crossbeam_queue::ArrayQueue` is, laid out in the region): a push claims a position by
//! moving `tail`, writes its slot, then publishes it by storing the slot's stamp. It never
//! blocks, awaits or allocates, and a full ring refuses the click so the caller can count the
//! drop. The one consumer, the drain, reads published slots from its own cursor and releases
//! them only once the window holds their datagram, so that a process killed in between leaves
//! every click in the ring or the window (see `state`).
//!
//! A process killed in the middle of a push leaves a claimed slot that was never published:
//! the next process finds it between `head` and `tail` with the stamp of a claim, and marks it
//! torn ([`Ring::mark_torn`]); the drain skips it, never misreads it.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};

use protocol::dimensions::{Agent, Country, Device, Dimensions, MAX_REFERRER_LEN};
use protocol::wire::{CodeError, MAX_CODE_LEN};

/// A click as a slot holds it: its code and its dimensions (inline, no allocation) and when
/// it happened.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Slot {
    at_us: i64,
    /// The code's length, or `TORN`.
    len: u8,
    /// `Agent as u8`.
    agent: u8,
    /// `Device as u8`, or `NONE`.
    device: u8,
    /// The referrer's length, or `NONE`.
    referrer_len: u8,
    /// Two letters, or zeros for none.
    country: [u8; 2],
    code: [u8; MAX_CODE_LEN],
    referrer: [u8; MAX_REFERRER_LEN],
}

/// How long a push that finds its cell still holding the last lap's click, while `head` says
/// the drain has freed it, reads again before it counts the ring as full: the drain frees
/// cells one after another once `head` moved, within a moment, unless preempted (or a page
/// of the region's file faults in).
const FULL_WAIT: std::time::Duration = std::time::Duration::from_micros(200);
/// A slot's `len` when its push was cut off by the death of the process.
const TORN: u8 = u8::MAX;
/// A dimension not recorded.
const NONE: u8 = u8::MAX;

impl Slot {
    /// Microseconds since the Unix epoch, as `protocol::now_us()` gave it.
    pub fn at_us(&self) -> i64 {
        self.at_us
    }

    /// The code. Never an error for a slot a push wrote; a slot of a layout this process does
    /// not know is refused before it is read, and this is the last line of defence.
    pub fn code(&self) -> Result<&str, CodeError> {
        let len = usize::from(self.len);
        let bytes = self.code.get(..len).ok_or(CodeError::TooLong(len))?;
        std::str::from_utf8(bytes).map_err(|e| CodeError::BadByte {
            at: e.valid_up_to(),
            byte: bytes[e.valid_up_to()],
        })
    }

    /// The click's dimensions. What a push did not write (the last line of defence again,
    /// as for `code`) reads as not recorded, or as an unknown agent.
    pub fn dimensions(&self) -> Dimensions<'_> {
        let referrer = self
            .referrer
            .get(..usize::from(self.referrer_len))
            .and_then(|r| std::str::from_utf8(r).ok());
        Dimensions {
            agent: Agent::from_u8(self.agent).unwrap_or(Agent::Unknown),
            referrer,
            device: Device::from_u8(self.device),
            country: (self.country != [0; 2])
                .then(|| Country::parse(&self.country))
                .flatten(),
        }
    }

    fn write(&mut self, at_us: i64, code: &[u8], d: &Dimensions<'_>) {
        self.at_us = at_us;
        self.len = code.len() as u8;
        self.code[..code.len()].copy_from_slice(code);
        self.agent = d.agent as u8;
        self.device = d.device.map_or(NONE, |d| d as u8);
        self.country = d.country.map_or([0; 2], |c| c.bytes());
        match d.referrer {
            Some(r) => {
                self.referrer_len = r.len() as u8;
                self.referrer[..r.len()].copy_from_slice(r.as_bytes());
            }
            None => self.referrer_len = NONE,
        }
    }
}

/// One position of the ring in the region: the stamp says whose it is (Vyukov's sequence,
/// doubled so that a ring of one cell works too: `2 pos` free for a push at `pos`, `2 pos + 1`
/// published, `2 (pos + capacity)` read and free for the next lap).
#[repr(C)]
pub(crate) struct Cell {
    stamp: AtomicU64,
    slot: UnsafeCell<Slot>,
}

/// A cell's stamp when it is free for a push at `pos`.
fn free(pos: u64) -> u64 {
    pos * 2
}

/// A cell's stamp once the push at `pos` is written.
fn published(pos: u64) -> u64 {
    pos * 2 + 1
}

/// The ring's positions, each in a cache line of its own: pushers move `tail`, the drain `head`.
#[repr(C, align(64))]
#[derive(Default)]
pub(crate) struct Position(AtomicU64);

impl Position {
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// What keeps the memory of a ring's cells and positions alive (the state region's mapping).
pub(crate) type Memory = std::sync::Arc<dyn std::any::Any + Send + Sync>;

/// Why a push did not take a click.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    #[error("ring full")]
    Full,
    #[error("code longer than {MAX_CODE_LEN} bytes")]
    CodeTooLong,
    #[error("referrer longer than {MAX_REFERRER_LEN} bytes")]
    ReferrerTooLong,
}

/// What the drain finds at a position.
#[derive(Clone, Copy)]
pub enum Read {
    Click(Slot),
    /// A push the death of an earlier process cut off: nothing to send.
    Torn,
    /// Nothing published there yet.
    Empty,
}

/// The ring, over cells and positions that live in the state region (which `_memory` keeps
/// mapped as long as the ring lives).
pub struct Ring {
    head: &'static Position,
    tail: &'static Position,
    cells: &'static [Cell],
    /// `tail` when this process opened the ring: what it pushes itself starts there.
    opened_at: u64,
    _memory: Memory,
}

// SAFETY: a cell's slot is written only by the push that claimed its position (the CAS on
// `tail` gives each position to one pusher), before the Release store of its stamp, and read
// only by the drain after an Acquire load of that stamp shows it published.
unsafe impl Sync for Ring {}
unsafe impl Send for Ring {}

impl Ring {
    /// Size of one cell in the region.
    pub const CELL_SIZE: usize = std::mem::size_of::<Cell>();

    /// The ring over `cells` of a mapped region. A new region's stamps are set by `format`.
    pub(crate) fn new(
        head: &'static Position,
        tail: &'static Position,
        cells: &'static [Cell],
        memory: Memory,
    ) -> Ring {
        Ring {
            head,
            tail,
            cells,
            opened_at: tail.0.load(Ordering::Acquire),
            _memory: memory,
        }
    }

    /// Makes a zeroed region an empty ring: each cell free for the first lap.
    pub(crate) fn format(cells: &[Cell]) {
        for (pos, cell) in cells.iter().enumerate() {
            cell.stamp.store(free(pos as u64), Ordering::Relaxed);
        }
    }

    fn cell(&self, pos: u64) -> &Cell {
        &self.cells[self.index(pos)]
    }

    fn index(&self, pos: u64) -> usize {
        (pos % self.cells.len() as u64) as usize
    }

    /// Queues a click without blocking.
    pub fn push(
        &self,
        code: &str,
        at_us: i64,
        dimensions: &Dimensions<'_>,
    ) -> Result<(), PushError> {
        let bytes = code.as_bytes();
        if bytes.len() > MAX_CODE_LEN {
            return Err(PushError::CodeTooLong);
        }
        if dimensions
            .referrer
            .is_some_and(|r| r.len() > MAX_REFERRER_LEN)
        {
            return Err(PushError::ReferrerTooLong);
        }
        let mut pos = self.tail.0.load(Ordering::Relaxed);
        let mut waiting_since = None;
        loop {
            let index = self.index(pos);
            let cell = &self.cells[index];
            let stamp = cell.stamp.load(Ordering::Acquire);
            if stamp == free(pos) {
                match self.tail.0.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: the CAS gave this position to this push alone (see `Sync`).
                        let slot = unsafe { &mut *cell.slot.get() };
                        slot.write(at_us, bytes, dimensions);
                        cell.stamp.store(published(pos), Ordering::Release);
                        // The next push most likely takes the next cell, which the ring's
                        // size has long put out of cache: asked for now, its lines are on
                        // their way (to the shared cache, if that push runs on another core).
                        let next = self.cells.get(index + 1).unwrap_or(&self.cells[0]);
                        shared::cache::prefetch(next);
                        return Ok(());
                    }
                    Err(now) => pos = now,
                }
            } else if stamp < free(pos) {
                // The cell still holds the click of the last lap: the ring is full, unless the
                // stamp is older than `pos` (a relaxed load may be satisfied after a later
                // acquire one, on a weakly ordered CPU) and the drain freed the cell since.
                // Full only if `head` says so after a fence, as crossbeam's `ArrayQueue` has it.
                // Or the drain is freeing it (it moves `head` first): a moment, unless its
                // thread was preempted there; a request does not wait on it for longer.
                std::sync::atomic::fence(Ordering::SeqCst);
                if self.head() + self.cells.len() as u64 <= pos {
                    return Err(PushError::Full);
                }
                let since = *waiting_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > FULL_WAIT {
                    return Err(PushError::Full);
                }
                std::hint::spin_loop();
                pos = self.tail.0.load(Ordering::Relaxed);
            } else {
                pos = self.tail.0.load(Ordering::Relaxed);
            }
        }
    }

    /// The drain's read at `pos` (from `head` on): the slot if it is published.
    pub fn read(&self, pos: u64) -> Read {
        let cell = self.cell(pos);
        if cell.stamp.load(Ordering::Acquire) != published(pos) {
            return Read::Empty;
        }
        // SAFETY: published (the Acquire above pairs with the push's Release), and no push
        // writes it again before `release` frees it.
        let slot = unsafe { *cell.slot.get() };
        match slot.len {
            TORN => Read::Torn,
            _ => Read::Click(slot),
        }
    }

    /// Positions before `through` are read and their clicks kept elsewhere: free them. `head`
    /// moves first: a process killed before the cells are freed leaves them to `repair`,
    /// rather than leaving freed cells after `head` that would read as torn.
    pub fn release(&self, through: u64) {
        let head = self.head();
        if through <= head {
            return;
        }
        self.head.0.store(through, Ordering::Release);
        for pos in head..through {
            let next_lap = pos + self.cells.len() as u64;
            self.cell(pos)
                .stamp
                .store(free(next_lap), Ordering::Release);
        }
    }

    /// Frees every cell outside `head .. tail` for its next push, whatever an earlier process
    /// left there (a release cut short). Only for a ring no push can reach yet (at adoption).
    pub(crate) fn repair(&self) {
        let (head, tail) = (self.head(), self.tail());
        for pos in tail..head + self.cells.len() as u64 {
            self.cell(pos).stamp.store(free(pos), Ordering::Release);
        }
    }

    /// Marks the claimed and never published positions between `head` and `tail` torn, and
    /// returns how many. Only for a ring no push can reach yet (at adoption).
    pub(crate) fn mark_torn(&self) -> u64 {
        let mut torn = 0;
        for pos in self.head()..self.tail() {
            let cell = self.cell(pos);
            if cell.stamp.load(Ordering::Acquire) != published(pos) {
                // SAFETY: no push or read runs yet.
                unsafe { (*cell.slot.get()).len = TORN };
                cell.stamp.store(published(pos), Ordering::Release);
                torn += 1;
            }
        }
        torn
    }

    /// The positions between `head` and `tail` marked torn (by this adoption or an earlier
    /// one): not clicks. Only for a ring no push can reach yet (at adoption).
    pub(crate) fn torn(&self) -> u64 {
        (self.head()..self.tail())
            .filter(|&pos| matches!(self.read(pos), Read::Torn))
            .count() as u64
    }

    /// The oldest position not released.
    pub fn head(&self) -> u64 {
        self.head.0.load(Ordering::Acquire)
    }

    /// The next position a push claims.
    pub fn tail(&self) -> u64 {
        self.tail.0.load(Ordering::Acquire)
    }

    /// Clicks this process pushed (a push under way counts once it has claimed its cell): the
    /// count of queued clicks, kept by `tail` rather than by a second locked add a click.
    pub(crate) fn pushed(&self) -> u64 {
        self.tail() - self.opened_at
    }

    /// Clicks pushed and not released.
    pub fn len(&self) -> usize {
        self.tail().saturating_sub(self.head()) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.cells.len()
    }

    /// Bytes the ring's cells take in the region.
    pub fn memory(&self) -> usize {
        std::mem::size_of_val(self.cells)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// A ring over memory of the heap (the state region's layout, not its mapping).
    fn ring(capacity: usize) -> std::sync::Arc<Ring> {
        struct Heap {
            head: Position,
            tail: Position,
            cells: Box<[Cell]>,
        }
        // SAFETY: shared the way the ring shares its cells (see the ring's `Sync`).
        unsafe impl Sync for Heap {}
        unsafe impl Send for Heap {}
        let empty = || Cell {
            stamp: AtomicU64::new(0),
            slot: UnsafeCell::new(Slot {
                at_us: 0,
                len: 0,
                agent: 0,
                device: NONE,
                referrer_len: NONE,
                country: [0; 2],
                code: [0; MAX_CODE_LEN],
                referrer: [0; MAX_REFERRER_LEN],
            }),
        };
        let heap = std::sync::Arc::new(Heap {
            head: Position::default(),
            tail: Position::default(),
            cells: (0..capacity).map(|_| empty()).collect(),
        });
        // SAFETY: the references live as long as `heap`, which the ring keeps.
        let (head, tail, cells): (&'static Position, &'static Position, &'static [Cell]) = unsafe {
            (
                &*std::ptr::addr_of!(heap.head),
                &*std::ptr::addr_of!(heap.tail),
                &*std::ptr::addr_of!(*heap.cells),
            )
        };
        Ring::format(cells);
        std::sync::Arc::new(Ring::new(head, tail, cells, heap))
    }

    /// Reads and releases one click.
    fn pop(ring: &Ring) -> Option<Slot> {
        let head = ring.head();
        match ring.read(head) {
            Read::Click(slot) => {
                ring.release(head + 1);
                Some(slot)
            }
            _ => None,
        }
    }

    #[test]
    fn keeps_order_and_refuses_when_full() {
        let ring = ring(2);
        ring.push("a", 1, &Dimensions::default()).unwrap();
        ring.push("bb", 2, &Dimensions::default()).unwrap();
        assert_eq!(
            ring.push("c", 3, &Dimensions::default()),
            Err(PushError::Full)
        );
        let first = pop(&ring).unwrap();
        assert_eq!((first.code(), first.at_us()), (Ok("a"), 1));
        assert_eq!(pop(&ring).unwrap().code(), Ok("bb"));
        assert!(pop(&ring).is_none());
        ring.push("d", 4, &Dimensions::default()).unwrap();
        assert_eq!(pop(&ring).unwrap().code(), Ok("d"), "the next lap");
    }

    #[test]
    fn holds_a_longest_code_and_refuses_a_longer_one() {
        let ring = ring(4);
        let longest = "x".repeat(MAX_CODE_LEN);
        ring.push(&longest, 7, &Dimensions::default()).unwrap();
        assert_eq!(pop(&ring).unwrap().code(), Ok(longest.as_str()));
        assert_eq!(
            ring.push(&"x".repeat(MAX_CODE_LEN + 1), 7, &Dimensions::default()),
            Err(PushError::CodeTooLong)
        );
    }

    #[test]
    fn a_claimed_and_never_published_slot_is_torn_never_read() {
        let ring = ring(4);
        ring.push("a", 1, &Dimensions::default()).unwrap();
        // A push that claimed position 1 and died before publishing it.
        ring.tail.0.store(2, Ordering::Release);
        assert!(matches!(ring.read(1), Read::Empty), "unpublished: not read");
        assert_eq!(ring.mark_torn(), 1);
        assert_eq!(ring.mark_torn(), 0, "counted once");
        assert!(matches!(ring.read(0), Read::Click(_)));
        assert!(matches!(ring.read(1), Read::Torn));
        ring.release(2);
        ring.push("c", 3, &Dimensions::default()).unwrap();
        assert_eq!(pop(&ring).unwrap().code(), Ok("c"));
    }

    #[test]
    fn cell_is_small() {
        // The stamp, the time, a longest code and a longest referrer host.
        assert_eq!(Ring::CELL_SIZE, 152);
    }

    #[test]
    fn concurrent_pushes_and_reads_lose_nothing() {
        let ring = ring(64);
        let per_thread = 10_000;
        let pushers: Vec<_> = (0..2)
            .map(|t| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    for i in 0..per_thread {
                        while ring
                            .push(if t == 0 { "a" } else { "b" }, i, &Dimensions::default())
                            .is_err()
                        {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut seen = [0i64; 2];
        let mut last = [-1i64; 2];
        while seen.iter().sum::<i64>() < 2 * per_thread {
            if let Some(slot) = pop(&ring) {
                let t = usize::from(slot.code() == Ok("b"));
                assert!(slot.at_us() > last[t], "one pusher's clicks stay in order");
                last[t] = slot.at_us();
                seen[t] += 1;
            }
        }
        for p in pushers {
            p.join().unwrap();
        }
        assert_eq!(seen, [per_thread, per_thread]);
    }
}
