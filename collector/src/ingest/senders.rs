//! Each sender's seqs as this collector knows them: the protocol's `Senders` (crate `protocol`)
//! over Unix socket addresses, loaded from `click_senders` at start.

use nix::sys::socket::UnixAddr;
use tokio_postgres::Client;

/// The senders, by the addresses their acknowledgements go to.
pub type Senders = protocol::senders::Senders<UnixAddr>;
/// A message for a sender at its address.
pub(crate) type Reply = protocol::senders::Reply<UnixAddr>;

/// The seqs committed so far, of every instance's senders: a sender not among them is judged
/// from seq 0, so a record skipped here (say, under an instance name since changed) would have
/// its committed datagrams written again. Only this instance's rows are ever deleted
/// (`store`), so loading another host's senders costs memory (bounded), never their rows.
pub(crate) async fn load(client: &Client) -> Result<Senders, tokio_postgres::Error> {
    let rows = client
        .query("SELECT sender, last_seq, clicks FROM click_senders", &[])
        .await?;
    // Stored as bigint: the u64 bits reinterpreted.
    let last = rows.iter().map(|r| {
        let column = |i| r.get::<_, i64>(i) as u64;
        (column(0), column(1), column(2))
    });
    Ok(Senders::committed(last))
}
