//! The resend window: datagrams that left the ring and are not acknowledged yet, in seq order,
//! in memory allocated once (`slots` x the datagram size limit).
//!
//! A datagram stays until an acknowledgement covers it; a full window refuses more, so the
//! drain stops and the ring holds (backpressure). Sending goes through a cursor: go-back-N
//! puts the cursor back to the oldest datagram (or the one a resend request names) and sends
//! everything from there again. Plain data and no I/O, so that it can be tested alone; its
//! slots and bounds live in a [`Store`], which may be memory that outlives the process: a
//! later process adopts the window ([`Window::adopt`]) and sends again what it holds.
//!
//! Crash consistency: a push writes the slot, then publishes it by moving `end`; an
//! acknowledgement moves `first`. Each is one atomic store, so a process killed at any
//! instant leaves bounds that cover only whole datagrams.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why an acknowledgement or a resend request was refused: it would make the window forget,
/// or resend, what it never sent. Only a forger or a confused collector sends such.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("acknowledges seq {0}, past the last seq ever sent")]
    AckNotSent(u64),
    #[error(
        "asks to resend from seq {0}, which is not held (acknowledged already, or never sent)"
    )]
    ResendNotHeld(u64),
}

/// What the window keeps of each datagram. `repr(C)` and plain integers, so that it can live in
/// memory that a later process maps (the redirector's state region).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Meta {
    len: u32,
    clicks: u32,
    /// Sent at least once (1): counted as sent; if unacknowledged at exit, as unacknowledged.
    sent: u32,
    _pad: u32,
    /// The caller's mark of what this datagram consumed (the redirector: the ring position
    /// after its last click), so that a later process knows what the window already holds.
    tag: u64,
    /// Clicks of every datagram of this sender before this one: what a resync reports.
    clicks_before: u64,
}

/// The window's bounds, `first .. end`, the only state besides the slots that a later process
/// needs. Atomics so that each is one store that is never torn, and so that a store into them
/// is not reordered before the slot writes it publishes.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Marks {
    first: AtomicU64,
    end: AtomicU64,
}

impl Marks {
    /// `first` and `end` as they are.
    pub fn get(&self) -> [u64; 2] {
        [&self.first, &self.end].map(|mark| mark.load(Ordering::Acquire))
    }
}

/// Where the window keeps its datagrams: the heap ([`Heap`]), or memory that outlives the
/// process (the redirector's state region). `bytes` is `meta.len() - 1` slots of `slot_size`:
/// there is one record more than slots, so that the record of the last datagram pushed (its
/// tag, what a later process reads) is never the one the next push writes before it publishes.
pub trait Store {
    fn parts(&self) -> (&[u8], &[Meta], &Marks);
    fn parts_mut(&mut self) -> (&mut [u8], &mut [Meta], &Marks);
}

/// A window's storage on the heap, allocated (and written) at once.
#[derive(Debug)]
pub struct Heap {
    bytes: Box<[u8]>,
    meta: Box<[Meta]>,
    marks: Marks,
}

impl Heap {
    pub fn new(slots: usize, slot_size: usize) -> Heap {
        let slots = slots.max(1);
        Heap {
            bytes: vec![0; slots * slot_size].into_boxed_slice(),
            meta: vec![Meta::default(); slots + 1].into_boxed_slice(),
            marks: Marks::default(),
        }
    }
}

impl Store for Heap {
    fn parts(&self) -> (&[u8], &[Meta], &Marks) {
        (&self.bytes, &self.meta, &self.marks)
    }

    fn parts_mut(&mut self) -> (&mut [u8], &mut [Meta], &Marks) {
        (&mut self.bytes, &mut self.meta, &self.marks)
    }
}

/// What a resend request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewound {
    /// The cursor went back: this many datagrams will be sent again.
    Resend(u64),
    /// The collector asked for a seq below the oldest held, which was acknowledged: it lost its
    /// record of this sender. Tell it where the window starts (a resync), then send all of it.
    Resync { first: u64, clicks_before: u64 },
}

/// What an acknowledgement did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub released: Released,
    /// `None` unless it asked for a resend.
    pub rewound: Option<Rewound>,
}

/// What leaving the window freed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    pub datagrams: u64,
    pub clicks: u64,
}

pub struct Window<S: Store = Heap> {
    store: S,
    slot_size: usize,
    slots: usize,
    /// Seq of the oldest datagram held (`Marks::first`, kept here too for reading).
    first: u64,
    /// Datagrams held: seqs `first .. first + held`.
    held: usize,
    /// Next seq to send: `first ..= first + held`.
    cursor: u64,
    /// Highest seq ever sent.
    sent_through: Option<u64>,
    clicks: u64,
    /// Clicks of every datagram acknowledged since seq 0: what a resync reports.
    acked_clicks: u64,
}

impl Window<Heap> {
    /// Room for `slots` datagrams of up to `slot_size` bytes, on the heap, allocated now.
    pub fn new(slots: usize, slot_size: usize) -> Window<Heap> {
        Window::adopt(Heap::new(slots, slot_size), slot_size)
    }
}

/// The seqs a store holds: from `first` to `end`, at most a slot each. A push into an empty
/// window that moved `first` and was killed before moving `end` never published that
/// datagram (its clicks are still where they came from).
fn held(meta: &[Meta], marks: &Marks) -> std::ops::Range<u64> {
    let slots = meta.len() as u64 - 1;
    let end = marks.end.load(Ordering::Acquire);
    let first = marks.first.load(Ordering::Acquire).min(end);
    end - (end - first).min(slots)..end
}

impl<S: Store> Window<S> {
    /// The window a store holds: a new one (all zero: empty, at seq 0), or one a killed process
    /// left. Everything held is sent again from the oldest (the collector drops what it
    /// committed already); what was acknowledged before is taken from the slots.
    pub fn adopt(store: S, slot_size: usize) -> Window<S> {
        let (_, meta, marks) = store.parts();
        let records = meta.len() as u64;
        let slots = meta.len() - 1;
        let in_window = held(meta, marks);
        let (first, end) = (in_window.start, in_window.end);
        let held = (end - first) as usize;
        let slot = |seq: u64| meta[(seq % records) as usize];
        let clicks = in_window
            .clone()
            .map(|seq| u64::from(slot(seq).clicks))
            .sum();
        let acked_clicks = match (held, end) {
            (_, 0) => 0,
            (0, _) => (slot(end - 1).clicks_before).saturating_add(u64::from(slot(end - 1).clicks)),
            _ => slot(first).clicks_before,
        };
        // What was sent before the kill may have been acknowledged by now: accept an
        // acknowledgement of anything held, sent in this life or not.
        let sent_through = end.checked_sub(1);
        marks.first.store(first, Ordering::Release);
        Window {
            store,
            slot_size,
            slots,
            first,
            held,
            cursor: first,
            sent_through,
            clicks,
            acked_clicks,
        }
    }

    /// Why the datagrams [`Window::adopt`] would take from `store` are not what a window of
    /// `sender` writes, if they are not: each fits a slot of `slot_size` bytes, and its header
    /// decodes and carries `sender`, its own seq and its record's count of clicks, and each
    /// record's clicks before and ring mark follow from the one before. A store that
    /// says otherwise (a corrupt file) is not to be adopted: its reads would run past a slot, or
    /// the collector would reject a datagram sent again for ever, stalling the window behind
    /// it. The clicks themselves are the collector's to judge: a build before or after this
    /// one, of the same datagram version, may have written them by other rules (a country it
    /// knows, say). A version this build does not read is refused for what it is.
    pub fn check(store: &S, slot_size: usize, sender: u64) -> Result<(), &'static str> {
        let (bytes, meta, marks) = store.parts();
        let records = meta.len() as u64;
        let slots = records - 1;
        // What the next record must say: its clicks before, and at least its tag.
        let mut follows: Option<(u64, u64)> = None;
        for seq in held(meta, marks) {
            let record = meta[(seq % records) as usize];
            let len = record.len as usize;
            if len > slot_size {
                return Err("its window holds a datagram longer than a slot");
            }
            // A resync reports the clicks before its first seq: refused for a count that does
            // not add up, it would be asked for again for good.
            if follows
                .is_some_and(|(before, tag)| record.clicks_before != before || record.tag < tag)
            {
                return Err("its window's records do not follow one another");
            }
            follows = Some((
                record
                    .clicks_before
                    .saturating_add(u64::from(record.clicks)),
                record.tag,
            ));
            let datagram = &bytes[(seq % slots) as usize * slot_size..][..len];
            match crate::wire::decode_header(datagram) {
                Err(crate::wire::Reject::WrongVersion { .. }) => {
                    return Err("its window holds a datagram of a version this build does not read")
                }
                Err(_) => return Err("its window holds a datagram that does not decode"),
                Ok(h)
                    if h.sender != sender
                        || h.seq != seq
                        || h.clicks != u64::from(record.clicks) =>
                {
                    return Err("its window holds a datagram other than its record says")
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// The storage, for a test that plays a later process adopting it.
    pub fn into_store(self) -> S {
        self.store
    }

    /// Starts over from seq 0 (a new sender id). The caller checks `is_empty` first.
    pub fn restart(&mut self) {
        assert!(self.is_empty(), "restart of a window that holds datagrams");
        let marks = self.store.parts().2;
        // `end` first: killed in between, `first` > `end` reads as empty at the old end.
        marks.end.store(0, Ordering::Release);
        marks.first.store(0, Ordering::Release);
        (
            self.first,
            self.cursor,
            self.sent_through,
            self.acked_clicks,
        ) = (0, 0, None, 0);
    }

    /// Bytes allocated.
    pub fn memory(&self) -> usize {
        let (bytes, meta, _) = self.store.parts();
        std::mem::size_of_val(bytes) + std::mem::size_of_val(meta)
    }

    pub fn is_full(&self) -> bool {
        self.held == self.slots
    }

    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Datagrams held.
    pub fn len(&self) -> usize {
        self.held
    }

    /// Clicks in the datagrams held.
    pub fn clicks(&self) -> u64 {
        self.clicks
    }

    /// Whether a datagram waits to be sent (for the first time or again).
    pub fn has_unsent(&self) -> bool {
        self.cursor < self.end()
    }

    /// Whether a datagram was sent and is not acknowledged: what an acknowledgement timeout
    /// is about.
    pub fn awaits_ack(&self) -> bool {
        self.cursor > self.first
    }

    fn end(&self) -> u64 {
        self.first + self.held as u64
    }

    /// Where datagram `seq`'s bytes are.
    fn slot(&self, seq: u64) -> usize {
        (seq % self.slots as u64) as usize
    }

    /// Where datagram `seq`'s record is (one more record than slots: see [`Store`]).
    fn record(&self, seq: u64) -> usize {
        (seq % (self.slots as u64 + 1)) as usize
    }

    /// Adds datagram `seq` (the one after the last held; any seq into an empty window), of
    /// `clicks` clicks, with the caller's `tag` (see [`Window::last_tag`]). The caller checks
    /// `is_full` first.
    pub fn push(&mut self, seq: u64, datagram: &[u8], clicks: u32, tag: u64) {
        assert!(!self.is_full(), "push into a full window");
        assert!(
            datagram.len() <= self.slot_size,
            "datagram over the slot size"
        );
        let moved_first = self.is_empty() && seq != self.first;
        if self.is_empty() {
            self.first = seq;
            self.cursor = seq;
        }
        assert_eq!(seq, self.end(), "datagrams enter the window in seq order");
        let (i, r) = (self.slot(seq), self.record(seq));
        // Saturating: an adopted region's counts are a file's, whatever it holds.
        let clicks_before = self.acked_clicks.saturating_add(self.clicks);
        let (bytes, meta, marks) = self.store.parts_mut();
        bytes[i * self.slot_size..][..datagram.len()].copy_from_slice(datagram);
        meta[r] = Meta {
            len: datagram.len() as u32,
            clicks,
            sent: 0,
            _pad: 0,
            tag,
            clicks_before,
        };
        if moved_first {
            marks.first.store(seq, Ordering::Release);
        }
        // Publishes the slot: a later process adopts it from here on.
        marks.end.store(seq + 1, Ordering::Release);
        self.held += 1;
        self.clicks += u64::from(clicks);
    }

    /// The datagram at the cursor, to send next.
    pub fn next_unsent(&self) -> Option<&[u8]> {
        if !self.has_unsent() {
            return None;
        }
        let (i, r) = (self.slot(self.cursor), self.record(self.cursor));
        let (bytes, meta, _) = self.store.parts();
        Some(&bytes[i * self.slot_size..][..meta[r].len as usize])
    }

    /// The datagram at the cursor was sent: moves on. Returns its clicks if this was its first
    /// send (they count as sent once), `None` for a resend.
    pub fn mark_sent(&mut self) -> Option<u32> {
        let r = self.record(self.cursor);
        self.sent_through = Some(
            self.sent_through
                .map_or(self.cursor, |s| s.max(self.cursor)),
        );
        self.cursor += 1;
        let meta = &mut self.store.parts_mut().1[r];
        (std::mem::replace(&mut meta.sent, 1) == 0).then_some(meta.clicks)
    }

    /// Everything up to `seq` is committed: those datagrams leave the window.
    pub fn acknowledge(&mut self, seq: u64) -> Result<Released, Refused> {
        if !self.sent(seq) {
            return Err(Refused::AckNotSent(seq));
        }
        let mut released = Released::default();
        while self.held > 0 && self.first <= seq {
            let r = self.record(self.first);
            released.datagrams += 1;
            released.clicks += u64::from(self.store.parts().1[r].clicks);
            self.first += 1;
            self.held -= 1;
        }
        self.store
            .parts()
            .2
            .first
            .store(self.first, Ordering::Release);
        self.clicks -= released.clicks;
        self.acked_clicks = self.acked_clicks.saturating_add(released.clicks);
        self.cursor = self.cursor.max(self.first);
        Ok(released)
    }

    /// Drops every datagram held, unacknowledged; returns their clicks. For a sender whose
    /// history is not this window's (see the redirector's drain), before [`Window::restart`].
    pub fn discard(&mut self) -> u64 {
        let dropped = self.clicks;
        self.first = self.end();
        self.held = 0;
        self.clicks = 0;
        self.cursor = self.first;
        self.store
            .parts()
            .2
            .first
            .store(self.first, Ordering::Release);
        dropped
    }

    /// Applies an acknowledgement: what is `committed` leaves, then the cursor goes back to
    /// `resend_from`. Refused whole, before either changes anything, if either names a seq
    /// never sent: a half-applied one would free clicks that no count of the caller's holds.
    pub fn apply(
        &mut self,
        committed: Option<u64>,
        resend_from: Option<u64>,
    ) -> Result<Applied, Refused> {
        if let Some(seq) = resend_from.filter(|&seq| !self.sent(seq)) {
            return Err(Refused::ResendNotHeld(seq));
        }
        let released = committed.map_or(Ok(Released::default()), |seq| self.acknowledge(seq))?;
        let rewound = resend_from.map(|seq| self.rewind_to(seq)).transpose()?;
        Ok(Applied { released, rewound })
    }

    /// Go-back-N from `seq` (a resend request): the cursor goes back to it, or, if `seq` was
    /// acknowledged already, to the oldest datagram held, with a resync to send first.
    pub fn rewind_to(&mut self, seq: u64) -> Result<Rewound, Refused> {
        if !self.sent(seq) {
            return Err(Refused::ResendNotHeld(seq));
        }
        if seq < self.first {
            self.rewind();
            return Ok(Rewound::Resync {
                first: self.first,
                clicks_before: self.acked_clicks,
            });
        }
        let again = self.cursor.saturating_sub(seq);
        self.cursor = self.cursor.min(seq);
        Ok(Rewound::Resend(again))
    }

    /// Go-back-N from the oldest datagram held (an acknowledgement timeout, or a new
    /// connection to the collector). Returns how many datagrams will be sent again.
    pub fn rewind(&mut self) -> u64 {
        let again = self.cursor - self.first;
        self.cursor = self.first;
        again
    }

    /// (clicks never sent, clicks sent and not acknowledged), for the count at exit.
    pub fn unsent_and_unacked(&self) -> (u64, u64) {
        let meta = self.store.parts().1;
        (self.first..self.end())
            .map(|seq| meta[self.record(seq)])
            .fold((0, 0), |(unsent, unacked), m| match m.sent {
                0 => (unsent + u64::from(m.clicks), unacked),
                _ => (unsent, unacked + u64::from(m.clicks)),
            })
    }

    /// The tag of the last datagram pushed (kept after it is acknowledged), or `None` before
    /// the first push of this sender: how far a later process knows its source was consumed.
    pub fn last_tag(&self) -> Option<u64> {
        let end = self.end();
        (end > 0).then(|| self.store.parts().1[self.record(end - 1)].tag)
    }

    /// The seq the next datagram takes.
    pub fn next_seq(&self) -> u64 {
        self.end()
    }

    /// Whether datagram `seq` was sent (an adopted window's held ones count as sent).
    fn sent(&self, seq: u64) -> bool {
        self.sent_through.is_some_and(|s| seq <= s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window of `slots` holding datagrams `seqs`, each `[seq as u8; 3]` with 10 clicks.
    fn window(slots: usize, seqs: std::ops::Range<u64>) -> Window {
        let mut w = Window::new(slots, 8);
        for seq in seqs {
            w.push(seq, &[seq as u8; 3], 10, seq);
        }
        w
    }

    fn send_all(w: &mut Window) -> Vec<u8> {
        let mut sent = Vec::new();
        while let Some(d) = w.next_unsent() {
            sent.push(d[0]);
            w.mark_sent();
        }
        sent
    }

    #[test]
    fn sends_in_order_and_forgets_what_is_acknowledged() {
        let mut w = window(4, 5..9);
        assert!(w.is_full());
        assert_eq!(w.clicks(), 40);
        assert_eq!(w.mark_sent(), Some(10), "first send counts");
        assert_eq!(send_all(&mut w), [6, 7, 8]);
        assert_eq!(
            w.acknowledge(6),
            Ok(Released {
                datagrams: 2,
                clicks: 20
            })
        );
        assert!(!w.is_full());
        w.push(9, &[9; 3], 10, 9);
        assert_eq!(send_all(&mut w), [9], "the slot of 5 is reused for 9");
        assert_eq!(
            w.acknowledge(9),
            Ok(Released {
                datagrams: 3,
                clicks: 30
            })
        );
        assert!(w.is_empty() && !w.awaits_ack());
        assert_eq!(w.acknowledge(3), Ok(Released::default()), "stale: nothing");
    }

    #[test]
    fn go_back_n_resends_from_the_oldest_or_the_one_asked_for_and_counts_once() {
        let mut w = window(8, 0..5);
        send_all(&mut w);
        assert_eq!(w.rewind(), 5);
        assert_eq!(w.mark_sent(), None, "a resend is not a new send");
        assert_eq!(send_all(&mut w), [1, 2, 3, 4]);
        assert_eq!(w.rewind_to(3), Ok(Rewound::Resend(2)));
        assert_eq!(send_all(&mut w), [3, 4]);
        assert_eq!(w.unsent_and_unacked(), (0, 50));
    }

    #[test]
    fn refuses_to_forget_or_resend_what_it_never_sent() {
        let mut w = window(8, 10..14);
        assert_eq!(
            w.acknowledge(10),
            Err(Refused::AckNotSent(10)),
            "nothing sent yet"
        );
        w.mark_sent();
        w.mark_sent();
        assert_eq!(w.acknowledge(12), Err(Refused::AckNotSent(12)));
        assert_eq!(w.rewind_to(12), Err(Refused::ResendNotHeld(12)));
        assert_eq!(w.clicks(), 40, "nothing was forgotten");
        assert_eq!(w.unsent_and_unacked(), (20, 20));
        assert_eq!(w.acknowledge(u64::MAX), Err(Refused::AckNotSent(u64::MAX)));
        assert_eq!(w.apply(Some(10), Some(12)), Err(Refused::ResendNotHeld(12)));
        assert_eq!(
            (w.clicks(), w.unsent_and_unacked()),
            (40, (20, 20)),
            "an acknowledgement refused for its resend request forgot nothing"
        );
        assert!(w.apply(Some(10), Some(11)).is_ok());
        assert_eq!(w.clicks(), 30);
    }

    #[test]
    fn a_resend_request_below_the_window_answers_with_where_it_starts() {
        let mut w = window(8, 0..4);
        send_all(&mut w);
        w.acknowledge(1).unwrap();
        assert_eq!(
            w.rewind_to(0),
            Ok(Rewound::Resync {
                first: 2,
                clicks_before: 20
            })
        );
        assert_eq!(send_all(&mut w), [2, 3], "then everything held, again");
        w.acknowledge(3).unwrap();
        w.restart();
        w.push(0, &[0; 3], 10, 0);
        w.mark_sent();
        assert_eq!(
            w.rewind_to(0),
            Ok(Rewound::Resend(1)),
            "a new sender id counts from zero"
        );
    }

    #[test]
    fn a_later_process_adopts_what_is_held_and_resends_it_from_the_oldest() {
        let mut w = window(4, 0..3);
        send_all(&mut w);
        w.acknowledge(0).unwrap();
        let mut later = Window::adopt(w.into_store(), 8);
        assert_eq!((later.len(), later.clicks(), later.next_seq()), (2, 20, 3));
        assert_eq!(later.last_tag(), Some(2));
        assert_eq!(send_all(&mut later), [1, 2], "everything held, again");
        assert_eq!(
            later.rewind_to(0),
            Ok(Rewound::Resync {
                first: 1,
                clicks_before: 10
            }),
            "what was acknowledged before the kill is known"
        );
        later.acknowledge(2).unwrap();
        let empty = Window::adopt(later.into_store(), 8);
        assert!(empty.is_empty());
        assert_eq!((empty.next_seq(), empty.last_tag()), (3, Some(2)));
        let mut again = Window::adopt(empty.into_store(), 8);
        again.push(3, &[3; 3], 10, 3);
        assert_eq!(again.mark_sent(), Some(10));
        assert_eq!(
            again.rewind_to(0),
            Ok(Rewound::Resync {
                first: 3,
                clicks_before: 30
            }),
            "acknowledged clicks carry over an empty window"
        );
    }

    #[test]
    fn a_push_killed_before_it_published_leaves_the_last_tag_of_a_one_slot_window() {
        let mut w = window(1, 0..1);
        send_all(&mut w);
        w.acknowledge(0).unwrap();
        let mut store = w.into_store();
        // The record of seq 1, written by a push killed before it moved `end`.
        let record = 1 % store.parts().1.len();
        store.parts_mut().1[record].tag = 99;
        let w = Window::adopt(store, 8);
        assert_eq!(w.last_tag(), Some(0), "the last published datagram's tag");
        assert_eq!(w.next_seq(), 1);
    }

    #[test]
    fn a_push_killed_before_it_published_is_not_adopted() {
        let mut store = Heap::new(4, 8);
        store.parts().2.end.store(5, Ordering::Release);
        store.parts().2.first.store(5, Ordering::Release);
        // The push of seq 9 into the empty window moved `first`, and died before `end`.
        store.parts_mut().1[1].clicks = 99;
        store.parts().2.first.store(9, Ordering::Release);
        let w = Window::adopt(store, 8);
        assert!(w.is_empty(), "nothing unpublished is read");
        assert_eq!(w.next_seq(), 5);
        assert_eq!(w.clicks(), 0);
    }

    #[test]
    #[should_panic(expected = "seq order")]
    fn datagrams_enter_in_seq_order() {
        window(4, 0..2).push(5, b"x", 1, 5);
    }
}
