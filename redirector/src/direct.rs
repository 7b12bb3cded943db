//! `--clicks direct`: one INSERT per click, awaited inside the request. The slow baseline the
//! benchmarks compare the pipeline with, as the reference shortener's per-request INSERT.
//!
//! A tokio-postgres `Client` pipelines concurrent queries over its connection, so a few
//! clients used in turn are the whole pool.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::Notify;
use tokio_postgres::{Client, Statement};

use crate::metrics::{Common, Dropped};
use shared::metrics::Counter;

pub(crate) struct Direct {
    clients: Box<[(Client, Statement)]>,
    next: AtomicUsize,
    /// Clicks being recorded, and the wake-up when the last of them is done.
    recording: AtomicUsize,
    settled: Notify,
}

impl Direct {
    /// Opens `connections` (at least 1) connections to the database, each with the INSERT
    /// prepared.
    pub(crate) async fn connect(
        config: &shared::db::Config,
        connections: usize,
    ) -> Result<Direct, tokio_postgres::Error> {
        let mut clients = Vec::with_capacity(connections);
        for _ in 0..connections.max(1) {
            let client = shared::db::connect(config).await?;
            let insert = client
                .prepare("INSERT INTO clicks (code, clicked_at) VALUES ($1, $2)")
                .await?;
            clients.push((client, insert));
        }
        Ok(Direct {
            clients: clients.into(),
            next: AtomicUsize::new(0),
            recording: AtomicUsize::new(0),
            settled: Notify::new(),
        })
    }

    /// Inserts the click and counts it with its redirect, on a task of its own: a request
    /// dropped while its INSERT is under way (the client gone) would otherwise leave a row
    /// whose redirect was never counted.
    pub(crate) async fn record(
        self: &Arc<Self>,
        code: &str,
        redirects: &Counter,
        common: &Arc<Common>,
    ) {
        let (direct, code) = (self.clone(), code.to_owned());
        let (redirects, common) = (redirects.clone(), common.clone());
        // Counted before the task exists, so that `settled` cannot miss it.
        self.recording.fetch_add(1, Relaxed);
        let _ = tokio::spawn(async move {
            match direct.insert(&code).await {
                Ok(()) => {
                    common.clicks_sent.inc();
                }
                Err(e) => {
                    common.clicks_dropped.inc(Dropped::DirectFailed);
                    let why = shared::db::describe(&e);
                    tracing::warn!(code, error = %why, "direct insert of a {code:?} click: {why}");
                }
            }
            redirects.inc();
            // Release: the counts above are seen by whoever sees the click done.
            if direct.recording.fetch_sub(1, Release) == 1 {
                direct.settled.notify_waiters();
            }
        })
        .await;
    }

    /// Waits until every click being recorded is counted, so that counts read afterwards are
    /// final.
    pub(crate) async fn settled(&self) {
        loop {
            // Registered before the check, so a last click done in between still wakes us.
            let settled = self.settled.notified();
            if self.recording.load(Acquire) == 0 {
                return;
            }
            settled.await;
        }
    }

    pub(crate) async fn insert(&self, code: &str) -> Result<(), tokio_postgres::Error> {
        let i = self.next.fetch_add(1, Relaxed) % self.clients.len();
        let (client, insert) = &self.clients[i];
        client.execute(insert, &[&code, &SystemTime::now()]).await?;
        Ok(())
    }
}
