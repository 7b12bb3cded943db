//! The last accepted seq of each sender (redirector process), to skip duplicates and count
//! gaps: loaded from click_senders at start; a batch commits its senders' seqs with its rows.

pub use shared::seq::{Seqs as Senders, Verdict};
use tokio_postgres::Client;

/// The seqs committed so far; a sender not among them is judged from seq 0.
pub async fn load(client: &Client) -> Result<Senders, tokio_postgres::Error> {
    let rows = client
        .query("SELECT sender, last_seq FROM click_senders", &[])
        .await?;
    let last = rows
        .iter()
        // Stored as bigint: the u64 bits reinterpreted.
        .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64))
        .collect();
    Ok(Senders::from_start(last))
}
