//! Floods of distinct codes: more codes than the collector can keep sums of in memory, sent as
//! fast as it takes them. The collector's memory test and `scripts/bench memory` send these.

use std::ops::Range;
use std::path::Path;

use protocol::wire::{EncodeError, Encoder, DEFAULT_DATAGRAM, MAX_CODE_LEN};

/// Code `i` of the flood: 64 bytes (the longest a click may carry), the first 16 hex digits a
/// bijection of `i` (so every `i` has its own code) and the rest spread as well, so that the
/// codes land all over click_counts' index as real codes do, not at its end in order.
pub fn distinct_code(i: u64) -> String {
    let parts = [0, 1, 2, 3].map(|k| mix(i ^ (k << 60)));
    let code = format!(
        "{:016x}{:016x}{:016x}{:016x}",
        parts[0], parts[1], parts[2], parts[3]
    );
    debug_assert_eq!(code.len(), MAX_CODE_LEN);
    code
}

/// splitmix64's finalizer: a bijection of u64.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Sends one click of each of codes `codes` ([`distinct_code`]), stamped now, from sender
/// `sender` (seq 0 on) on a socket connected to `path`, waiting whenever the collector's queue
/// is full: as fast as it takes them. Blocking; returns the clicks sent.
pub fn send_distinct(path: &Path, sender: u64, codes: Range<u64>) -> u64 {
    let sock = crate::collector::connect(path);
    let mut enc = Encoder::new(sender, DEFAULT_DATAGRAM).expect("the default datagram limit");
    let send = |enc: &mut Encoder| {
        sock.send(enc.datagram())
            .unwrap_or_else(|e| panic!("sending to {}: {e}", path.display()));
        enc.next();
    };
    let mut sent = 0;
    for i in codes {
        let code = distinct_code(i);
        let now = protocol::now_us();
        if let Err(EncodeError::Full) = enc.push(&code, now) {
            send(&mut enc);
            enc.push(&code, now)
                .expect("one click fits an empty datagram");
        }
        sent += 1;
    }
    if !enc.is_empty() {
        send(&mut enc);
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_valid_and_64_bytes() {
        let codes: std::collections::HashSet<String> = (0..10_000).map(distinct_code).collect();
        assert_eq!(codes.len(), 10_000);
        for code in &codes {
            assert_eq!(code.len(), 64);
            protocol::wire::validate_code(code.as_bytes()).unwrap();
        }
    }
}
