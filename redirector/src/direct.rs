//! `--clicks direct`: one INSERT per click, awaited inside the request. The slow baseline the
//! benchmarks compare the pipeline with, as the reference shortener's per-request INSERT.
//!
//! A tokio-postgres `Client` pipelines concurrent queries over its connection, so a few
//! clients used in turn are the whole pool.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::SystemTime;

use tokio_postgres::{Client, Statement};

pub struct Direct {
    clients: Box<[(Client, Statement)]>,
    next: AtomicUsize,
}

impl Direct {
    /// Opens `connections` (at least 1) connections to `url`, each with the INSERT prepared.
    pub async fn connect(url: &str, connections: usize) -> Result<Direct, tokio_postgres::Error> {
        let config: tokio_postgres::Config = url.parse()?;
        let mut clients = Vec::with_capacity(connections);
        for _ in 0..connections.max(1) {
            let client = shared::db::connect(&config).await?;
            let insert = client
                .prepare("INSERT INTO clicks (code, clicked_at) VALUES ($1, $2)")
                .await?;
            clients.push((client, insert));
        }
        Ok(Direct {
            clients: clients.into(),
            next: AtomicUsize::new(0),
        })
    }

    pub async fn insert(&self, code: &str) -> Result<(), tokio_postgres::Error> {
        let i = self.next.fetch_add(1, Relaxed) % self.clients.len();
        let (client, insert) = &self.clients[i];
        client.execute(insert, &[&code, &SystemTime::now()]).await?;
        Ok(())
    }
}
