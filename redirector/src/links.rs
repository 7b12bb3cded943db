//! The link table: every row of `links`, loaded into an immutable map that requests read
//! without a lock and that a background task replaces whole when the table changes.
//!
//! The task LISTENs on `links_changed` (a trigger notifies on every change) and also reloads
//! periodically, in case a notification was lost with a connection. While the database is away
//! the last map keeps being served and the task reconnects with capped backoff.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use hyper::header::HeaderValue;
use tokio::sync::{watch, Notify};
use tokio_postgres::{AsyncMessage, Client, NoTls};

use crate::metrics::Metrics;
use shared::backoff::Backoff;

/// Code -> the `Location` to answer with.
pub type Map = HashMap<Box<str>, HeaderValue>;

/// After a notification, wait this long for the rest of a burst of changes before reloading.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// How many skipped rows a load names in the log; the rest are only counted.
const SKIPPED_LOGGED: usize = 5;

/// The map being served, or none before the first load.
pub struct LinkTable {
    map: ArcSwapOption<Map>,
    loaded: watch::Sender<bool>,
}

impl Default for LinkTable {
    fn default() -> Self {
        LinkTable {
            map: ArcSwapOption::empty(),
            loaded: watch::Sender::new(false),
        }
    }
}

/// The answer for a code.
pub enum Lookup {
    Found(HeaderValue),
    Unknown,
    /// No table loaded yet.
    NotLoaded,
}

impl LinkTable {
    pub fn lookup(&self, code: &str) -> Lookup {
        match &*self.map.load() {
            None => Lookup::NotLoaded,
            Some(map) => map
                .get(code)
                .map_or(Lookup::Unknown, |v| Lookup::Found(v.clone())),
        }
    }

    pub fn is_loaded(&self) -> bool {
        self.map.load().is_some()
    }

    /// Resolves once the first map is in place.
    pub async fn wait_loaded(&self) {
        let mut rx = self.loaded.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|loaded| *loaded).await;
    }

    pub fn replace(&self, map: Map) {
        self.map.store(Some(Arc::new(map)));
        self.loaded.send_replace(true);
    }
}

/// Builds a map from `(code, url)` rows, leaving out (and naming in the log) rows whose code is
/// not a valid click code or whose URL is not a valid header value. Returns the map and how
/// many rows it left out.
pub fn build(rows: impl IntoIterator<Item = (String, String)>) -> (Map, usize) {
    let mut map = Map::new();
    let mut skipped = 0;
    for (code, url) in rows {
        let why = match (
            shared::wire::validate_code(code.as_bytes()),
            HeaderValue::try_from(url.as_str()),
        ) {
            (Ok(()), Ok(location)) => {
                map.insert(code.into_boxed_str(), location);
                continue;
            }
            (Err(e), _) => format!("bad code: {e}"),
            (_, Err(_)) => "URL is not a valid Location header value".to_owned(),
        };
        skipped += 1;
        if skipped <= SKIPPED_LOGGED {
            tracing::warn!("skipping link {code:?} -> {url:?}: {why}");
        }
    }
    if skipped > SKIPPED_LOGGED {
        tracing::warn!("skipped {skipped} links in all");
    }
    (map, skipped)
}

/// Keeps `table` loaded from the database at `url` for as long as the process runs.
pub async fn keep_loaded(
    url: String,
    table: Arc<LinkTable>,
    metrics: Arc<Metrics>,
    reload_every: Duration,
) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        let err = session(&url, &table, &metrics, reload_every, &mut backoff).await;
        metrics.link_load_errors.inc();
        let wait = backoff.next_wait();
        tracing::warn!(
            "link table: {err}; serving the last table ({} links), retrying in {wait:?}",
            metrics.links.get()
        );
        tokio::time::sleep(wait).await;
    }
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("database: {}", shared::db::describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("database connection closed")]
    Closed,
}

/// One database connection's life: LISTEN, load, then reload on notifications and on the timer,
/// until something fails.
async fn session(
    url: &str,
    table: &LinkTable,
    metrics: &Metrics,
    reload_every: Duration,
    backoff: &mut Backoff,
) -> SessionError {
    let (client, connection) = match tokio_postgres::connect(url, NoTls).await {
        Ok(pair) => pair,
        Err(e) => return e.into(),
    };
    let changed = Arc::new(Notify::new());
    let mut driver = AbortOnDrop(tokio::spawn(drive(connection, changed.clone())));
    // LISTEN before the first load, so that no change between the two goes unseen.
    if let Err(e) = client.batch_execute("LISTEN links_changed").await {
        return e.into();
    }
    let mut tick = tokio::time::interval(reload_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = changed.notified() => tokio::time::sleep(DEBOUNCE).await,
            _ = &mut driver.0 => return SessionError::Closed,
        }
        if let Err(e) = load(&client, table, metrics).await {
            return e;
        }
        backoff.reset();
    }
}

async fn load(client: &Client, table: &LinkTable, metrics: &Metrics) -> Result<(), SessionError> {
    let rows = client.query("SELECT code, url FROM links", &[]).await?;
    let (map, skipped) = build(
        rows.into_iter()
            .map(|row| (row.get::<_, String>(0), row.get::<_, String>(1))),
    );
    let first = !table.is_loaded();
    metrics.links.set(map.len() as i64);
    metrics.links_skipped.set(skipped as i64);
    metrics.link_loads.inc();
    if first {
        tracing::info!("link table loaded: {} links", map.len());
    } else {
        tracing::debug!("link table reloaded: {} links", map.len());
    }
    table.replace(map);
    Ok(())
}

/// Drives the connection and turns each `links_changed` notification into a wake-up.
async fn drive(
    mut connection: tokio_postgres::Connection<
        tokio_postgres::Socket,
        tokio_postgres::tls::NoTlsStream,
    >,
    changed: Arc<Notify>,
) {
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notification(_))) => changed.notify_one(),
            Some(Ok(AsyncMessage::Notice(n))) => tracing::info!("database notice: {}", n.message()),
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::warn!("link table connection: {}", shared::db::describe(&e));
                return;
            }
            None => return,
        }
    }
}

/// A spawned task that is aborted when its owner goes away.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_skips_bad_codes_and_urls() {
        let rows = [
            ("ok", "https://example.com/a"),
            ("bad code", "https://example.com/b"),
            ("newline", "https://example.com/\nx"),
        ]
        .map(|(c, u)| (c.to_owned(), u.to_owned()));
        let (map, skipped) = build(rows);
        assert_eq!(skipped, 2);
        assert_eq!(map.len(), 1);
        assert_eq!(map["ok"], "https://example.com/a");
    }

    #[test]
    fn lookup_tells_unloaded_from_unknown() {
        let table = LinkTable::default();
        assert!(matches!(table.lookup("a"), Lookup::NotLoaded));
        table.replace(build([("a".to_owned(), "http://x/".to_owned())]).0);
        assert!(matches!(table.lookup("a"), Lookup::Found(v) if v == "http://x/"));
        assert!(matches!(table.lookup("b"), Lookup::Unknown));
        assert!(table.is_loaded());
    }
}
