//! The redirector's metrics, each declared once.

use shared::metrics::{Counter, Gauge, LabeledCounter};

shared::label! {
    /// Why a click that was served did not reach the collector.
    pub enum Dropped: "reason" {
        /// The ring was full (the collector away or slow for longer than the ring holds).
        RingFull = "ring_full",
        /// Still in the ring or the unsent datagram when the drain timeout ran out at shutdown.
        Shutdown = "shutdown",
        /// The encoder refused the click (a bad timestamp: the clock is outside years 1 to
        /// 9999), or the ring or the encoder refused its code or referrer as too long.
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
        /// Held in a `--state-file` region found after a reboot that its process did not stop
        /// cleanly before: the file's pages are what the kernel had written back by then, each
        /// of its own age, so neither the clicks nor their seqs are trusted. Or held in a region
        /// restored from an older copy, found out by the collector's record of its sender (see
        /// `Drain::abandon_history`). Not sent; an upper bound (some may have been committed).
        StaleRegion = "stale_region",
    }
}

shared::label! {
    /// Why the redirect server closed a client's connection itself.
    pub enum Closed: "reason" {
        /// At the connection limit, it was the first to make room (idle the longest, or the
        /// slowest request head) when a new client came, as the last look found them.
        Evicted = "evicted",
        /// A new client at the limit while no connection was idle: closed at once.
        Refused = "refused",
        /// Idle between requests for `--idle-timeout`.
        IdleTimeout = "idle_timeout",
        /// A request head not received whole within `--header-read-timeout`.
        HeaderTimeout = "header_timeout",
        /// A response the client did not take within `--write-timeout`.
        WriteTimeout = "write_timeout",
        /// A request head over `http`'s `MAX_HEAD`, or of over 100 headers: answered
        /// 431, its click never counted anywhere else.
        HeadTooLarge = "head_too_large",
        /// A request that is not HTTP/1: answered 400.
        BadRequest = "bad_request",
        /// HTTP/2's connection preface: a client, most likely a proxy, that speaks HTTP/2
        /// without asking first ("prior knowledge", h2c) where this server speaks HTTP/1.1
        /// only. Closed without an answer (it would not read one); under `bad_request`, it
        /// was told from garbage by nothing.
        Http2 = "http2",
    }
}

shared::metrics! {
    /// What more than one component counts (each component declares and registers its own
    /// beside its code: `http`, `drain`, `links`). Hot paths only do relaxed atomic adds.
    pub struct Common {
        clicks_recovered: Counter = "clicks_recovered",
            "Clicks an earlier process left in the state region (ring and resend window), adopted at start.";
        clicks_reclaimed: Counter = "clicks_reclaimed",
            "Of the clicks recovered, those the last stop counted as dropped (shutdown, unacknowledged; in its log) because it could not tell that systemd's store would keep them: sent after all, not lost.";
        clicks_sent: Counter = "clicks_sent", "Clicks in datagrams the kernel accepted.";
        /// Set once, at start: the counts made as the state region is adopted (torn,
        /// stale_region, recovered) show in no `increase()` when they equal the last
        /// process's, and a new series' first value in none; the ClicksDropped alert reads
        /// them beside it.
        start_time_seconds: Gauge = "start_time_seconds",
            "When this process started, in seconds since the Unix epoch.";
        clicks_dropped: LabeledCounter<Dropped> = "clicks_dropped",
            "Clicks lost, by reason: served and not sent, sent and never acknowledged (unacknowledged), or cut off mid-push by a kill (torn, never answered).";
        /// Set when `/metrics` is read, from `Ring::pushed`.
        clicks_queued: Counter = "clicks_queued", "Clicks pushed into the ring.";
        /// Set when `/metrics` is read.
        ring_depth: Gauge = "ring_depth", "Clicks waiting in the ring.";
        /// Set when `/metrics` is read.
        ring_capacity: Gauge = "ring_capacity", "Clicks the ring holds.";
        admin_connections_closed: LabeledCounter<shared::admin::Closed> =
            "admin_connections_closed",
            "Admin listener connections it closed itself to stay within its bound, by reason.";
    }
}
