//! The collector's handling of received datagrams (`collector::ingest::intake`), each one with the
//! address and credentials the kernel would report: the input is split into datagrams at
//! 0xff bytes, and each one's first byte picks its sender's address and process. Never a panic,
//! and the batch holds exactly the clicks of the datagrams accepted.
#![no_main]

use collector::write::batch::{Batch, DateWindow};
use collector::ingest::intake::{Intake, Outcome};
use collector::ingest::senders::Senders;
use libfuzzer_sys::fuzz_target;
use nix::sys::socket::UnixAddr;
use protocol::Creds;
use shared::socket::Received;

fuzz_target!(|data: &[u8]| {
    let window = DateWindow { max_age_us: 86_400_000_000, max_skew_us: 300_000_000 };
    let mut intake = Intake::new(Senders::default(), window, None, 65_536);
    let mut batch = Batch::default();
    let now = std::time::Instant::now();
    let now_us = 1_790_000_000_000_000;
    let mut accepted = 0;
    for piece in data.split(|&b| b == 0xff) {
        let Some((&pick, bytes)) = piece.split_first() else { continue };
        let meta = Received {
            len: bytes.len(),
            truncated: pick & 0x80 != 0,
            from: (pick & 1 != 0).then(|| UnixAddr::new_abstract(b"fuzz").unwrap()),
            creds: Some(Creds { pid: i32::from(pick >> 1 & 3), uid: 0, gid: 0 }),
            ..Received::default()
        };
        let (outcome, _) = intake.take(bytes, &meta, &mut batch, now, now_us);
        if let Outcome::Accepted { clicks, .. } = outcome {
            accepted += clicks;
        }
    }
    assert_eq!(batch.received(), accepted);
});
