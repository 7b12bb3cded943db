//! Datagrams in: the socket and its stop fence (`socket`), the receive loop (`receive`), what
//! one datagram does (`intake`), the senders' records (`senders`) and the replies to them
//! (`replies`), the `--mirror`, and the start-up check of `--allow-uid` (`userns`).

pub mod intake;
pub(crate) mod mirror;
pub(crate) mod receive;
pub(crate) mod replies;
pub mod senders;
pub(crate) mod socket;
pub(crate) mod userns;

use protocol::RejectReason;
use shared::metrics::{Counter, Gauge, LabeledCounter};

/// The most senders a batch holds (each a row of click_senders, and entries in the batch): a
/// batch is handed over at this many, as at `--batch-rows` clicks. Those count no datagram
/// without clicks, so a flood of such from fresh ids would otherwise grow a batch with the rate
/// the receiver reads them at. A host runs a few redirectors, each under one id at a time.
pub const SENDERS_PER_BATCH: usize = 4_096;

shared::label! {
    /// What a sender's resync did.
    pub(crate) enum Resync: "outcome" {
        /// The record of the sender was behind: the gap was skipped and counted.
        Skipped = "skipped",
        /// The record was not behind (a repeated resync): nothing changed.
        Stale = "stale",
        /// It answered no resend request of this collector's (one in flight across a restart,
        /// or a forger's): ignored.
        Unasked = "unasked",
    }
}

shared::metrics! {
    /// What the receive loop counts: datagrams, their senders, the replies to them, the mirror.
    pub(crate) struct Metrics {
        datagrams_received: Counter = "datagrams_received", "Datagrams received, valid or not.";
        receive_errors: Counter = "receive_errors",
            "Reads of the socket that failed; the receive loop pauses 10 ms and reads again.";
        datagrams_rejected: LabeledCounter<RejectReason> = "datagrams_rejected",
            "Datagrams rejected whole, by reason.";
        senders: Gauge = "senders", "Sender ids known (each redirector process has one).";
        senders_evicted: Counter = "senders_evicted",
            "Sender ids forgotten: idle for 29 days, or past the bounds of a flood of fresh ids.";
        datagrams_duplicate: Counter = "datagrams_duplicate",
            "Datagrams skipped because their sender's seq was already accepted.";
        datagrams_lost: Counter = "datagrams_lost",
            "Datagrams missing from gaps in a sender's seq.";
        datagrams_out_of_order: Counter = "datagrams_out_of_order",
            "Datagrams of a sender that expects acknowledgements, past the seq awaited: not \
             accepted; the sender resends from the missing one.";
        acks_sent: Counter = "acks_sent",
            "Acknowledgements sent: a sender's datagrams up to a seq are committed.";
        resend_requests: Counter = "resend_requests",
            "Requests to a sender to resend from the datagram awaited.";
        acks_failed: Counter = "acks_failed",
            "Acknowledgements and resend requests the socket did not take (the sender gone, \
             or the send buffer full); the next one covers them.";
        resyncs: LabeledCounter<Resync> = "resyncs",
            "Resyncs from senders asked for seqs they no longer hold, by outcome.";
        clicks_received: Counter = "clicks_received", "Clicks accepted into a batch.";
        clicks_rejected: Counter = "clicks_rejected",
            "Clicks of datagrams rejected whole that were passed over: the header named their \
             sender, the seq it was at and how many clicks it held (so it is not held there \
             resending them for good); lost, counted here once the batch that passes them over \
             commits.";
        mirror_sent: Counter = "mirror_sent", "Datagrams forwarded to the mirror socket.";
        mirror_failed: Counter = "mirror_failed", "Datagrams the mirror socket did not take.";
    }
}
