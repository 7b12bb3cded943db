//! Each sender's seqs as this collector knows them: the protocol's `Senders` (crate `protocol`)
//! over Unix socket addresses, loaded from `click_senders` at start.

use std::os::unix::ffi::OsStrExt;

use nix::sys::socket::UnixAddr;
use tokio_postgres::Client;

/// The senders, by the addresses their acknowledgements go to.
pub type Senders = protocol::senders::Senders<UnixAddr>;
/// A message for a sender at its address.
pub(crate) type Reply = protocol::senders::Reply<UnixAddr>;

/// The seqs committed so far, of every instance's senders, and where each one's
/// acknowledgements go: a sender not among them is judged from seq 0, so a record skipped here
/// (say, under an instance name since changed) would have its committed datagrams written
/// again; and a sender's address is what its id is taken from (`Senders::replying_at`). Only
/// this instance's rows are ever deleted (`store`), so loading another host's senders costs
/// memory (bounded), never their rows.
pub(crate) async fn load(client: &Client) -> Result<Senders, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT sender, last_seq, clicks, reply_to, reply_uid FROM click_senders",
            &[],
        )
        .await?;
    // Stored as bigint: the u64 bits reinterpreted.
    let id = |r: &tokio_postgres::Row, i| r.get::<_, i64>(i) as u64;
    let last = rows.iter().map(|r| (id(r, 0), id(r, 1), id(r, 2)));
    let addresses = rows.iter().filter_map(|r| {
        let path = r.get::<_, Option<&[u8]>>(3)?;
        let at = UnixAddr::new(std::ffi::OsStr::from_bytes(path)).ok()?;
        let uid = r
            .get::<_, Option<i64>>(4)
            .and_then(|u| u32::try_from(u).ok());
        Some((id(r, 0), at, uid))
    });
    Ok(Senders::committed(last).replying_at(addresses))
}
