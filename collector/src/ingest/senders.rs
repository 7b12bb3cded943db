//! Each sender's seqs as this collector knows them: the protocol's `Senders` (crate `protocol`)
//! over Unix socket addresses, loaded from `click_senders` at start.

use nix::sys::socket::UnixAddr;
use tokio_postgres::Client;

use crate::write::batch::recorded_reply;

/// The senders, by the addresses their acknowledgements go to.
pub type Senders = protocol::senders::Senders<UnixAddr>;
/// A message for a sender at its address.
pub(crate) type Reply = protocol::senders::Reply<UnixAddr>;

/// The most senders loaded at start: what a sweep over `MAX_SENDERS` leaves.
const LOADED: i64 = (protocol::senders::MAX_SENDERS / 10 * 9) as i64;

/// The seqs committed so far, of every instance's senders, and where each one's
/// acknowledgements go: a sender not among them is judged from seq 0, so a record skipped here
/// (say, under an instance name since changed) would have its committed datagrams written
/// again; and a sender's address is what its id is taken from (`Senders::replying_at`). Only
/// this instance's rows are ever deleted (`store`), so loading another host's senders costs
/// memory (bounded), never their rows. Of more than `LOADED`, `instance`'s first (another
/// host's many must not push this one's out), then the most recently committed: loaded all,
/// they would all look alike to the first sweep (none seen yet), which would forget a tenth of
/// them at random, a live sender's record among them (its datagram committed and not
/// acknowledged yet, resent, then written again). Those left out are the ones the sweep would
/// forget first.
pub(crate) async fn load(
    client: &Client,
    instance: &str,
) -> Result<Senders, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT sender, last_seq, clicks, reply_to, reply_uid FROM click_senders
             ORDER BY instance IS NOT DISTINCT FROM $2 DESC, updated_at DESC LIMIT $1",
            &[&LOADED, &instance],
        )
        .await?;
    // Stored as bigint: the u64 bits reinterpreted.
    let id = |r: &tokio_postgres::Row, i| r.get::<_, i64>(i) as u64;
    let last = rows.iter().map(|r| (id(r, 0), id(r, 1), id(r, 2)));
    let addresses = rows.iter().filter_map(|r| {
        let (at, uid) = recorded_reply(r, 3)?;
        Some((id(r, 0), at, uid))
    });
    Ok(Senders::committed(last).replying_at(addresses))
}

#[cfg(test)]
mod tests {
    /// Past `LOADED` senders, this instance's first, then the most recently committed: the
    /// first sweep would otherwise forget a tenth of them, whichever. Rows inserted oldest
    /// first, so that a scan in their order would load the oldest.
    #[tokio::test]
    async fn past_the_bound_this_instances_and_the_most_recently_committed_senders_are_loaded() {
        let db = testkit::pgtest::test_db().await;
        let client = testkit::pgtest::connect(&db.url).await;
        let rows = "INSERT INTO click_senders (sender, last_seq, clicks, updated_at, instance)
                    SELECT n, 7, 70, now() - ($1::int8 + 1001 - n) * interval '1 second',
                           CASE WHEN n = 1 THEN 'here' ELSE 'elsewhere' END
                    FROM generate_series(1, $1::int8 + 1000) AS n";
        client.execute(rows, &[&super::LOADED]).await.unwrap();
        let senders = super::load(&client, "here").await.unwrap();
        assert_eq!(senders.len(), super::LOADED as usize);
        let newest = super::LOADED as u64 + 1000;
        let known = |ids: [u64; 3]| ids.map(|id| senders.knows(id));
        // This instance's oldest, another's newest, another's oldest.
        assert_eq!(known([1, newest, 2]), [true, true, false]);
    }
}
