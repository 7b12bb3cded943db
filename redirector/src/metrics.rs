//! The redirector's counters and their Prometheus rendering for the admin listener.

use std::sync::{Arc, LazyLock};

use shared::metrics::{Counter, FloatGauge, Gauge, LabeledCounter, Text};
use shared::socket::SendErrorKind;

use crate::links::LinkTable;
use crate::ring::Ring;

/// Why a click that was served did not reach the collector.
pub mod reason {
    /// The ring was full (the collector away or slow for longer than the ring holds).
    pub const RING_FULL: &str = "ring_full";
    /// Still in the ring or the unsent datagram when the drain timeout ran out at shutdown.
    pub const SHUTDOWN: &str = "shutdown";
    /// The encoder refused the click (a bad timestamp: the clock is outside years 1 to 9999),
    /// or the ring refused its code as longer than `MAX_CODE_LEN`.
    pub const INVALID: &str = "invalid";
    /// `--clicks direct`: the INSERT failed.
    pub const DIRECT_FAILED: &str = "direct_failed";
    pub const ALL: [&str; 4] = [RING_FULL, SHUTDOWN, INVALID, DIRECT_FAILED];
}

/// Why the redirect server closed a client's connection itself.
pub mod closed {
    /// At the connection limit, it was the one idle the longest when a new client came.
    pub const EVICTED: &str = "evicted";
    /// A new client at the limit while no connection was idle: closed at once.
    pub const REFUSED: &str = "refused";
    /// Idle between requests for `--idle-timeout`.
    pub const IDLE_TIMEOUT: &str = "idle_timeout";
    /// A request head not received whole within `--header-read-timeout`.
    pub const HEADER_TIMEOUT: &str = "header_timeout";
    /// A response the client did not take within `--write-timeout`.
    pub const WRITE_TIMEOUT: &str = "write_timeout";
    pub const ALL: [&str; 5] = [
        EVICTED,
        REFUSED,
        IDLE_TIMEOUT,
        HEADER_TIMEOUT,
        WRITE_TIMEOUT,
    ];
}

static SEND_ERROR_KINDS: LazyLock<[&'static str; SendErrorKind::ALL.len()]> =
    LazyLock::new(|| SendErrorKind::ALL.map(SendErrorKind::as_str));

/// Everything the redirector counts. Hot paths only do relaxed atomic adds.
#[derive(Debug)]
pub struct Metrics {
    /// GET requests answered with a redirect: each one is a click, sent or dropped.
    pub redirects: Counter,
    /// HEAD requests answered with a redirect (not clicks).
    pub head_redirects: Counter,
    pub not_found: Counter,
    pub method_not_allowed: Counter,
    /// Redirect requests refused with 503 because no link table was loaded yet.
    pub not_ready: Counter,
    pub clicks_queued: Counter,
    pub clicks_sent: Counter,
    pub clicks_dropped: LabeledCounter,
    pub datagrams_sent: Counter,
    pub send_errors: LabeledCounter,
    /// Datagrams sent again: no acknowledgement came in time, the collector asked, or a new
    /// collector took over.
    pub resends: Counter,
    /// Acknowledgements taken.
    pub acks: Counter,
    /// Acknowledgements refused: from another uid, for another sender, or claiming what was
    /// never sent.
    pub acks_rejected: Counter,
    /// Clicks the collector acknowledged as committed.
    pub clicks_acked: Counter,
    /// Clicks in the resend window: out of the ring, not acknowledged yet.
    pub unacked_clicks: Gauge,
    /// Links in the table being served.
    pub links: Gauge,
    pub link_loads: Counter,
    pub link_load_errors: Counter,
    /// Rows of `links` left out because their code or URL is unusable.
    pub links_skipped: Gauge,
    /// Changed codes applied from the change log.
    pub link_changes_applied: Counter,
    /// How old the served state was when it was published: for changes, seconds from the
    /// newest applied change's `changed_at` to its application; for a full load, its duration.
    pub links_lag: FloatGauge,
    /// Unix time (the database's clock) of the last successful read of the change log.
    pub links_synced: FloatGauge,
    /// Client connections open, and the most that may be.
    pub connections: Gauge,
    pub connections_limit: Gauge,
    /// Connections the server closed itself, by `closed` reason.
    pub connections_closed: LabeledCounter,
    /// Failed accepts (out of descriptors, typically), each followed by a short wait.
    pub accept_errors: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            redirects: Counter::default(),
            head_redirects: Counter::default(),
            not_found: Counter::default(),
            method_not_allowed: Counter::default(),
            not_ready: Counter::default(),
            clicks_queued: Counter::default(),
            clicks_sent: Counter::default(),
            clicks_dropped: LabeledCounter::new(&reason::ALL),
            datagrams_sent: Counter::default(),
            send_errors: LabeledCounter::new(&*SEND_ERROR_KINDS),
            resends: Counter::default(),
            acks: Counter::default(),
            acks_rejected: Counter::default(),
            clicks_acked: Counter::default(),
            unacked_clicks: Gauge::default(),
            links: Gauge::default(),
            link_loads: Counter::default(),
            link_load_errors: Counter::default(),
            links_skipped: Gauge::default(),
            link_changes_applied: Counter::default(),
            links_lag: FloatGauge::default(),
            links_synced: FloatGauge::default(),
            connections: Gauge::default(),
            connections_limit: Gauge::default(),
            connections_closed: LabeledCounter::new(&closed::ALL),
            accept_errors: Counter::default(),
        }
    }
}

/// What `/metrics` and `/healthz` read.
pub struct AdminView {
    pub metrics: Arc<Metrics>,
    pub ring: Option<Arc<Ring>>,
    pub links: Arc<LinkTable>,
}

impl shared::admin::Admin for AdminView {
    fn metrics(&self) -> String {
        let m = &self.metrics;
        let (depth, capacity) = self
            .ring
            .as_ref()
            .map_or((0, 0), |r| (r.len() as i64, r.capacity() as i64));
        let counters = [
            (
                "redirects_total",
                "GET requests answered 302 (each one a click).",
                &m.redirects,
            ),
            (
                "head_redirects_total",
                "HEAD requests answered 302 (not clicks).",
                &m.head_redirects,
            ),
            (
                "not_found_total",
                "Requests for an unknown or malformed code (404).",
                &m.not_found,
            ),
            (
                "method_not_allowed_total",
                "Methods other than GET or HEAD (405).",
                &m.method_not_allowed,
            ),
            (
                "not_ready_total",
                "Answered 503 before the first link table load.",
                &m.not_ready,
            ),
            (
                "clicks_queued_total",
                "Clicks pushed into the ring.",
                &m.clicks_queued,
            ),
            (
                "clicks_sent_total",
                "Clicks in datagrams the kernel accepted.",
                &m.clicks_sent,
            ),
            (
                "datagrams_sent_total",
                "Datagrams the kernel accepted.",
                &m.datagrams_sent,
            ),
            (
                "resends_total",
                "Datagrams sent again: unacknowledged in time, asked for, or to a new collector.",
                &m.resends,
            ),
            (
                "acks_total",
                "Acknowledgements taken from the collector.",
                &m.acks,
            ),
            (
                "acks_rejected_total",
                "Acknowledgements refused: another uid, another sender, or unsent seqs.",
                &m.acks_rejected,
            ),
            (
                "clicks_acked_total",
                "Clicks the collector acknowledged as committed.",
                &m.clicks_acked,
            ),
            (
                "link_loads_total",
                "Full loads of the link table (at start, or when the change log cannot catch up).",
                &m.link_loads,
            ),
            (
                "link_load_errors_total",
                "Link table sessions lost: failed or timed-out connections, loads or reads.",
                &m.link_load_errors,
            ),
            (
                "link_changes_applied_total",
                "Changed codes applied from the change log.",
                &m.link_changes_applied,
            ),
            (
                "accept_errors_total",
                "Failed accepts of client connections (out of descriptors, typically).",
                &m.accept_errors,
            ),
        ];
        let gauges = [
            ("ring_depth", "Clicks waiting in the ring.", depth),
            ("ring_capacity", "Clicks the ring holds.", capacity),
            (
                "unacked_clicks",
                "Clicks out of the ring and not acknowledged yet (the resend window).",
                m.unacked_clicks.get(),
            ),
            ("links", "Links being served.", m.links.get()),
            (
                "links_skipped",
                "Rows of links left out for a bad code or URL.",
                m.links_skipped.get(),
            ),
            (
                "connections",
                "Client connections open.",
                m.connections.get(),
            ),
            (
                "connections_limit",
                "Client connections allowed at once (--max-connections, fitted under the descriptor limit).",
                m.connections_limit.get(),
            ),
        ];
        let float_gauges = [
            (
                "links_lag_seconds",
                "Seconds from the newest applied change's commit to its application (a full load: its duration).",
                m.links_lag.get(),
            ),
            (
                "links_synced_timestamp_seconds",
                "Unix time of the last successful read of the change log (0: none yet).",
                m.links_synced.get(),
            ),
        ];
        let mut text = Text::default();
        for (name, help, counter) in counters {
            text.counter(&format!("redirector_{name}"), help, counter.get());
        }
        for (name, help, value) in gauges {
            text.gauge(&format!("redirector_{name}"), help, value);
        }
        for (name, help, value) in float_gauges {
            text.gauge_f64(&format!("redirector_{name}"), help, value);
        }
        text.labeled(
            "redirector_clicks_dropped_total",
            "Clicks served but not sent, by reason.",
            "reason",
            &m.clicks_dropped,
        )
        .labeled(
            "redirector_send_errors_total",
            "Failed datagram sends, by kind.",
            "kind",
            &m.send_errors,
        )
        .labeled(
            "redirector_connections_closed_total",
            "Client connections the server closed itself, by reason.",
            "reason",
            &m.connections_closed,
        )
        .finish()
    }

    fn health(&self) -> Result<(), String> {
        if self.links.is_loaded() {
            Ok(())
        } else {
            Err("link table not loaded yet".into())
        }
    }
}
