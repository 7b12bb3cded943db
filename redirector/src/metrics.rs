//! The redirector's metrics, each declared once.

use shared::metrics::{Counter, FloatGauge, Gauge, LabeledCounter};
use shared::socket::SendErrorKind;

shared::label! {
    /// Why a click that was served did not reach the collector.
    pub enum Dropped: "reason" {
        /// The ring was full (the collector away or slow for longer than the ring holds).
        RingFull = "ring_full",
        /// Still in the ring or the unsent datagram when the drain timeout ran out at shutdown.
        Shutdown = "shutdown",
        /// The encoder refused the click (a bad timestamp: the clock is outside years 1 to
        /// 9999), or the ring refused its code as longer than `MAX_CODE_LEN`.
        Invalid = "invalid",
        /// `--clicks direct`: the INSERT failed.
        DirectFailed = "direct_failed",
        /// Sent, and not acknowledged when the drain timeout ran out at shutdown (the collector
        /// could not commit them in time, typically its database away). This process held the
        /// only copy it could resend: once it exits nobody resends them, so they are counted as
        /// lost. The collector may still write those it had received; nobody can tell.
        Unacknowledged = "unacknowledged",
        /// A push that the death of the process cut off (a SIGKILL between claiming a ring slot
        /// and publishing it), found by the next process in the state region. Its request was
        /// never answered.
        Torn = "torn",
    }
}

shared::label! {
    /// Why the redirect server closed a client's connection itself.
    pub enum Closed: "reason" {
        /// At the connection limit, it was the one idle the longest when a new client came.
        Evicted = "evicted",
        /// A new client at the limit while no connection was idle: closed at once.
        Refused = "refused",
        /// Idle between requests for `--idle-timeout`.
        IdleTimeout = "idle_timeout",
        /// A request head not received whole within `--header-read-timeout`.
        HeaderTimeout = "header_timeout",
        /// A response the client did not take within `--write-timeout`.
        WriteTimeout = "write_timeout",
    }
}

shared::metrics! {
    /// Everything the redirector counts. Hot paths only do relaxed atomic adds.
    pub struct Metrics, prefix "redirector" {
        /// Each one is a click, sent or dropped.
        redirects: Counter = "redirects", "GET requests answered 302 (each one a click).";
        head_redirects: Counter = "head_redirects", "HEAD requests answered 302 (not clicks).";
        not_found: Counter = "not_found", "Requests for an unknown or malformed code (404).";
        method_not_allowed: Counter = "method_not_allowed",
            "Methods other than GET or HEAD (405).";
        not_ready: Counter = "not_ready", "Answered 503 before the first link table load.";
        clicks_queued: Counter = "clicks_queued", "Clicks pushed into the ring.";
        clicks_recovered: Counter = "clicks_recovered",
            "Clicks an earlier process left in the state region (ring and resend window), adopted at start.";
        clicks_sent: Counter = "clicks_sent", "Clicks in datagrams the kernel accepted.";
        clicks_dropped: LabeledCounter<Dropped> = "clicks_dropped",
            "Clicks served but not sent, by reason.";
        datagrams_sent: Counter = "datagrams_sent", "Datagrams the kernel accepted.";
        send_errors: LabeledCounter<SendErrorKind> = "send_errors",
            "Failed datagram sends, by kind.";
        resends: Counter = "resends",
            "Datagrams sent again: unacknowledged in time, asked for, or to a new collector.";
        acks: Counter = "acks", "Acknowledgements taken from the collector.";
        acks_rejected: Counter = "acks_rejected",
            "Acknowledgements refused: another uid, another sender, or unsent seqs.";
        clicks_acked: Counter = "clicks_acked", "Clicks the collector acknowledged as committed.";
        resyncs: Counter = "resyncs",
            "Resyncs sent: the collector asked for seqs acknowledged already (it lost its record of this sender).";
        /// Set when `/metrics` is read.
        ring_depth: Gauge = "ring_depth", "Clicks waiting in the ring.";
        /// Set when `/metrics` is read.
        ring_capacity: Gauge = "ring_capacity", "Clicks the ring holds.";
        unacked_clicks: Gauge = "unacked_clicks",
            "Clicks out of the ring and not acknowledged yet (the resend window).";
        links: Gauge = "links", "Links being served.";
        link_loads: Counter = "link_loads",
            "Full loads of the link table (at start, or when the change log cannot catch up).";
        link_load_errors: Counter = "link_load_errors",
            "Link table sessions lost: failed or timed-out connections, loads or reads.";
        links_skipped: Gauge = "links_skipped", "Rows of links left out for a bad code or URL.";
        links_polling: Gauge = "links_polling", "1 while the link loader reads every 100 ms without LISTEN, 0 while it LISTENs.";
        link_changes_applied: Counter = "link_changes_applied",
            "Changed codes applied from the change log.";
        /// For changes, seconds from the newest applied change's `changed_at` to its
        /// application; for a full load, its duration.
        links_lag: FloatGauge = "links_lag_seconds",
            "Seconds from the newest applied change's commit to its application (a full load: its duration).";
        /// The database's clock.
        links_synced: FloatGauge = "links_synced_timestamp_seconds",
            "Unix time of the last successful read of the change log (0: none yet).";
        connections: Gauge = "connections", "Client connections open.";
        connections_limit: Gauge = "connections_limit",
            "Client connections allowed at once (--max-connections, fitted under the descriptor limit).";
        connections_closed: LabeledCounter<Closed> = "connections_closed",
            "Client connections the server closed itself, by reason.";
        accept_errors: Counter = "accept_errors",
            "Failed accepts of client connections (out of descriptors, typically).";
        admin_connections_closed: LabeledCounter<shared::admin::Closed> =
            "admin_connections_closed",
            "Admin listener connections it closed itself to stay within its bound, by reason.";
    }
}
