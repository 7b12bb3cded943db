//! The fixed ring between the request handlers and the drain task.
//!
//! A bounded lock-free queue (`crossbeam_queue::ArrayQueue`) of fixed-size slots with the code
//! stored inline: it is allocated once at start, a push is one `try_push` that never blocks,
//! awaits or allocates, and a full ring refuses the click so the caller can count the drop.

use crossbeam_queue::ArrayQueue;
use protocol::wire::MAX_CODE_LEN;

/// One click waiting for the drain task: its code (inline, no allocation) and when it happened.
#[derive(Clone, Copy)]
pub struct Slot {
    at_us: i64,
    len: u8,
    code: [u8; MAX_CODE_LEN],
}

impl Slot {
    /// Microseconds since the Unix epoch, as `protocol::now_us()` gave it.
    pub fn at_us(&self) -> i64 {
        self.at_us
    }

    pub fn code(&self) -> &str {
        // A slot is only built from a whole `&str` of at most MAX_CODE_LEN bytes, so its
        // first `len` bytes are that string, which is valid UTF-8.
        std::str::from_utf8(&self.code[..usize::from(self.len)])
            .expect("slot holds the bytes of a whole &str")
    }
}

/// Why a push did not take a click.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    #[error("ring full")]
    Full,
    #[error("code longer than {MAX_CODE_LEN} bytes")]
    CodeTooLong,
}

pub struct Ring {
    queue: ArrayQueue<Slot>,
}

impl Ring {
    /// Allocates the whole ring now. `capacity` must be at least 1.
    pub fn new(capacity: usize) -> Ring {
        Ring {
            queue: ArrayQueue::new(capacity),
        }
    }

    /// Size of one slot, for the memory figure logged at start.
    pub const SLOT_SIZE: usize = std::mem::size_of::<Slot>();

    /// Queues a click without blocking.
    pub fn push(&self, code: &str, at_us: i64) -> Result<(), PushError> {
        let bytes = code.as_bytes();
        if bytes.len() > MAX_CODE_LEN {
            return Err(PushError::CodeTooLong);
        }
        let mut slot = Slot {
            at_us,
            len: bytes.len() as u8,
            code: [0; MAX_CODE_LEN],
        };
        slot.code[..bytes.len()].copy_from_slice(bytes);
        self.queue.push(slot).map_err(|_| PushError::Full)
    }

    pub fn pop(&self) -> Option<Slot> {
        self.queue.pop()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.queue.capacity()
    }

    /// Bytes the queue's storage takes, written (so resident) at start: capacity x (slot size
    /// plus the one-word stamp `ArrayQueue` keeps beside each slot).
    pub fn memory(&self) -> usize {
        self.capacity() * (Self::SLOT_SIZE + std::mem::size_of::<usize>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_refuses_when_full() {
        let ring = Ring::new(2);
        ring.push("a", 1).unwrap();
        ring.push("bb", 2).unwrap();
        assert_eq!(ring.push("c", 3), Err(PushError::Full));
        let first = ring.pop().unwrap();
        assert_eq!((first.code(), first.at_us()), ("a", 1));
        assert_eq!(ring.pop().unwrap().code(), "bb");
        assert!(ring.pop().is_none());
    }

    #[test]
    fn holds_a_longest_code_and_refuses_a_longer_one() {
        let ring = Ring::new(4);
        let longest = "x".repeat(MAX_CODE_LEN);
        ring.push(&longest, 7).unwrap();
        assert_eq!(ring.pop().unwrap().code(), longest);
        assert_eq!(
            ring.push(&"x".repeat(MAX_CODE_LEN + 1), 7),
            Err(PushError::CodeTooLong)
        );
    }

    #[test]
    fn slot_is_small_and_memory_is_capacity_times_slot() {
        assert_eq!(Ring::SLOT_SIZE, 80);
        assert_eq!(Ring::new(1000).memory(), 88_000);
    }

    #[test]
    fn concurrent_pushes_and_pops_lose_nothing() {
        let ring = std::sync::Arc::new(Ring::new(64));
        let per_thread = 10_000;
        let pushers: Vec<_> = (0..2)
            .map(|t| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    for i in 0..per_thread {
                        while ring.push(if t == 0 { "a" } else { "b" }, i).is_err() {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut seen = [0i64; 2];
        let mut last = [-1i64; 2];
        while seen.iter().sum::<i64>() < 2 * per_thread {
            if let Some(slot) = ring.pop() {
                let t = usize::from(slot.code() == "b");
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
