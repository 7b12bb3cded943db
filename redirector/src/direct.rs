//! `--clicks direct`: one INSERT per click, awaited inside the request. The slow baseline the
//! benchmarks compare the pipeline with, as the reference shortener's per-request INSERT.
//!
//! A tokio-postgres `Client` pipelines concurrent queries over its connection, so a few
//! sessions used in turn are the whole pool. A session whose connection fails, or that stays
//! silent past twice `--link-timeout` (a commit waiting for a synchronous standby, which no
//! statement timeout covers), is dropped and opened again in the background (with the
//! services' backoff); a silent one's query is cancelled and its connection closed, so that
//! its server process ends rather than pile up. Meanwhile its clicks go to the other
//! sessions, or, with none left, are counted dropped (`direct_failed`) at once. So a database
//! that is away costs a request no wait, and every INSERT ends within twice `--link-timeout`,
//! and with it a stop.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use crate::metrics::{Common, Dropped};
use crate::session::AbortOnDrop;
use shared::metrics::Counter;
use shared::throttle::Throttle;

/// The `application_name` of the INSERTs' sessions, to find them in `pg_stat_activity`.
pub(crate) const APPLICATION_NAME: &str = "redirector-clicks";

const INSERT: &str = "INSERT INTO clicks (code, clicked_at) VALUES ($1, $2)";

#[derive(Debug, thiserror::Error)]
pub(crate) enum DirectError {
    #[error("{}", shared::db::describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("no answer from the database within {0:?}; the session is opened again")]
    Silent(Duration),
    #[error("no session to the database: each is being opened again")]
    NoSession,
}

struct Session {
    client: Client,
    insert: Statement,
    /// The connection, closed once the last click using the session is done with it.
    _driver: AbortOnDrop<()>,
}

impl Session {
    /// Connects with the INSERT prepared; the server cancels a statement that runs longer than
    /// `timeout` (one held by a lock, say), so that an INSERT given up on is not written.
    async fn open(config: &shared::db::Config, timeout: Duration) -> Result<Session, DirectError> {
        let open = async {
            let (client, connection) = config.connect_raw().await?;
            let driver = AbortOnDrop(tokio::spawn(async move {
                let _ = connection.await;
            }));
            let limit = shared::db::set_statement_timeout(timeout);
            config.set_up(&client, &limit).await?;
            let insert = client.prepare(INSERT).await?;
            Ok::<_, DirectError>(Session {
                client,
                insert,
                _driver: driver,
            })
        };
        let wait = silent_after(timeout);
        tokio::time::timeout(wait, open)
            .await
            .map_err(|_| DirectError::Silent(wait))?
    }
}

/// How long an answer is waited for: past the server's own statement timeout, which answers
/// first while the server answers at all.
fn silent_after(timeout: Duration) -> Duration {
    timeout.saturating_mul(2)
}

pub(crate) struct Direct {
    config: shared::db::Config,
    timeout: Duration,
    /// `None` while being opened again.
    sessions: Box<[Mutex<Option<Arc<Session>>>]>,
    next: AtomicUsize,
    /// Clicks being recorded, and the wake-up when the last of them is done.
    recording: AtomicUsize,
    settled: Notify,
    failed_log: Mutex<Throttle>,
}

impl Direct {
    /// Opens `connections` (at least 1) sessions to the database, each with the INSERT
    /// prepared; `timeout` is `--link-timeout`.
    pub(crate) async fn connect(
        config: shared::db::Config,
        connections: usize,
        timeout: Duration,
    ) -> Result<Direct, DirectError> {
        let config = config.guarded(timeout, APPLICATION_NAME);
        let mut sessions = Vec::with_capacity(connections.max(1));
        for _ in 0..connections.max(1) {
            let session = Session::open(&config, timeout).await?;
            sessions.push(Mutex::new(Some(Arc::new(session))));
        }
        Ok(Direct {
            config,
            timeout,
            sessions: sessions.into(),
            next: AtomicUsize::new(0),
            recording: AtomicUsize::new(0),
            settled: Notify::new(),
            failed_log: Mutex::new(Throttle::default()),
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
                    direct.failed(&format!("direct insert of a {code:?} click"), &e);
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

    /// One INSERT, on the next open session. Given up on after twice the timeout: the server
    /// is silent, and may still run it when it wakes (counted dropped, and a row).
    pub(crate) async fn insert(self: &Arc<Self>, code: &str) -> Result<(), DirectError> {
        let (i, session) = self.session().ok_or(DirectError::NoSession)?;
        let now = SystemTime::now();
        let params: [&(dyn ToSql + Sync); 2] = [&code, &now];
        let insert = session.client.execute(&session.insert, &params);
        let wait = silent_after(self.timeout);
        let error = match tokio::time::timeout(wait, insert).await {
            Ok(Ok(_)) => return Ok(()),
            // Refused (or cancelled by the statement timeout): the session itself is sound.
            Ok(Err(e)) if !session_lost(&session.client, &e) => return Err(e.into()),
            Ok(Err(e)) => e.into(),
            Err(_) => {
                self.cancel(&session);
                DirectError::Silent(wait)
            }
        };
        self.reopen(i, &session);
        Err(error)
    }

    /// Asks the server, on a connection of its own, to cancel what a silent session runs: its
    /// process then finds the session closed, and ends.
    fn cancel(self: &Arc<Self>, session: &Session) {
        let (direct, token) = (self.clone(), session.client.cancel_token());
        tokio::spawn(async move {
            let cancel = shared::db::cancel(&direct.config, &token);
            let why = match tokio::time::timeout(direct.timeout, cancel).await {
                Ok(Ok(())) => return,
                Ok(Err(e)) => shared::db::describe(&e),
                Err(_) => format!("no answer within {:?}", direct.timeout),
            };
            direct.failed("cancelling a silent INSERT", &why);
        });
    }

    /// The next session in turn that is open, and its place.
    fn session(&self) -> Option<(usize, Arc<Session>)> {
        let start = self.next.fetch_add(1, Relaxed);
        let n = self.sessions.len();
        (0..n).find_map(|k| {
            let i = (start + k) % n;
            lock(&self.sessions[i]).clone().map(|s| (i, s))
        })
    }

    /// Drops session `i` if it is still `stale`, and opens it again on a task of its own,
    /// retrying with the services' backoff until the database answers.
    fn reopen(self: &Arc<Self>, i: usize, stale: &Arc<Session>) {
        {
            let mut place = lock(&self.sessions[i]);
            if !place.as_ref().is_some_and(|s| Arc::ptr_eq(s, stale)) {
                return;
            }
            *place = None;
        }
        let direct = self.clone();
        tokio::spawn(async move {
            let mut backoff = shared::db::backoff();
            loop {
                backoff.wait().await;
                match Session::open(&direct.config, direct.timeout).await {
                    Ok(session) => {
                        *lock(&direct.sessions[i]) = Some(Arc::new(session));
                        return;
                    }
                    Err(e) => direct.failed("opening a session for direct inserts", &e),
                }
            }
        });
    }

    /// Logs a failure, at most a line a second.
    fn failed(&self, what: &str, e: &dyn std::fmt::Display) {
        if let Some(held) = lock(&self.failed_log).allow() {
            tracing::warn!(error = %e, held, "{what}: {e} ({held} more not logged)");
        }
    }
}

/// Whether `e` ended the session: its connection is closed, or the server is ending it (the
/// error can reach the query before the connection's end does).
fn session_lost(client: &Client, e: &tokio_postgres::Error) -> bool {
    let ending = e.as_db_error().is_some_and(|db| {
        let code = db.code().code();
        matches!(db.severity(), "FATAL" | "PANIC")
            || code.starts_with("08")
            || code.starts_with("57P")
    });
    ending || client.is_closed()
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding one; a poisoned lock still holds consistent data.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
