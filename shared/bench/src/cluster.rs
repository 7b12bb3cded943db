//! The bench's own PostgreSQL cluster in $OUT/pg, kept between runs: made, started and
//! stopped through scripts/lib/pg.sh, which scripts/dev and CI use too, so that the cluster's
//! access rules (peer authentication, and as root a server run as the unprivileged
//! `postgres` user) live in one place. Its settings are PostgreSQL's defaults, unlike the test
//! harness's (fsync off), since the figures are of a durable database.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::Res;

pub(crate) struct Cluster {
    repo: PathBuf,
    pub(crate) dir: PathBuf,
    out: PathBuf,
}

impl Cluster {
    /// Initialises the cluster if needed and starts it, with commit timestamps on (they time
    /// the hosts runs); one left running by an interrupted run without them is restarted. The
    /// room for WAL an interrupted run may have left set is given back.
    pub(crate) async fn start(repo: &Path, out: &Path) -> Res<Cluster> {
        let cluster = Cluster {
            repo: repo.to_owned(),
            dir: out.join("pg"),
            out: out.to_owned(),
        };
        cluster.pg("pg_prepare \"$OUT/postgres.log\" && { pg_initialized || pg_initdb \"$OUT/initdb.log\"; }")?;
        if cluster.pg("pg_running").is_ok() {
            let client = cluster.connect("postgres").await?;
            let setting = scalar(&client, "SHOW track_commit_timestamp").await?;
            if setting != "on" {
                cluster.pg("pg_stop")?;
            }
        }
        if cluster.pg("pg_running").is_err() {
            cluster.pg(
                "PG_OPTIONS=\"-c track_commit_timestamp=on ${PG_OPTIONS:-}\" pg_start \"$OUT/postgres.log\"",
            )?;
        }
        // A cluster left running takes the current access rules.
        cluster.pg("pg_reload_access")?;
        room_for_wal(&cluster.connect("postgres").await?, false).await?;
        Ok(cluster)
    }

    /// Runs `script` in bash with scripts/lib/pg.sh's functions, PGDIR and PGBIN set; its
    /// stderr is the reason it failed.
    fn pg(&self, script: &str) -> Res<()> {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "set -e; source scripts/lib/pg.sh; PGBIN=$(pg_bindir); {script}"
            ))
            .current_dir(&self.repo)
            .env("PGDIR", &self.dir)
            .env("OUT", &self.out)
            .output()
            .map_err(|e| format!("running bash for scripts/lib/pg.sh: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        Err(format!("{script}: {}", String::from_utf8_lossy(&out.stderr).trim()).into())
    }

    /// Stops the server if it runs.
    pub(crate) fn stop(&self) -> Res<()> {
        self.pg("if pg_running; then pg_stop; fi")
    }

    /// The libpq key=value string of database `db` as the superuser postgres.
    pub(crate) fn url(&self, db: &str) -> String {
        let host = shared::db::options::quoted(&self.dir.to_string_lossy());
        format!("host={host} user=postgres dbname={db}")
    }

    pub(crate) async fn connect(&self, db: &str) -> Res<tokio_postgres::Client> {
        connect(&self.url(db)).await
    }

    pub(crate) fn postmaster(&self) -> Res<i32> {
        crate::procfs::postmaster(&crate::procfs::data_dir(&self.dir))
    }
}

/// Stops the cluster of $OUT (`out`) if it runs, as every run ends.
pub(crate) fn stop_at(out: &Path) -> Res<()> {
    let cluster = Cluster {
        repo: std::env::current_dir()?,
        dir: out.join("pg"),
        out: out.to_owned(),
    };
    if !cluster.dir.join("data").is_dir() {
        return Ok(());
    }
    cluster.stop()
}

/// Waits until no autovacuum worker runs, then checkpoints: a run measured from here pays for
/// nothing a run before it left (its tables' vacuum, its dirty pages), whichever ran before.
pub(crate) async fn settle(admin: &tokio_postgres::Client, log: &Path) -> Res<()> {
    let workers = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'";
    let idle = || async { number(admin, workers).await.is_ok_and(|n| n == 0) };
    crate::services::until(Duration::from_secs(300), "autovacuum at rest", log, idle).await?;
    execute(admin, "CHECKPOINT").await
}

/// Room for a run's WAL (`on`), or the default back: a run writes about as much WAL as the
/// default max_wal_size lets pass before PostgreSQL checkpoints on its own, which then fell
/// inside some runs and not others. With room, the checkpoints the bench asks for are the only
/// ones.
async fn room_for_wal(admin: &tokio_postgres::Client, on: bool) -> Res<()> {
    let set = if on {
        "ALTER SYSTEM SET max_wal_size = '4GB'"
    } else {
        "ALTER SYSTEM RESET max_wal_size"
    };
    execute(admin, set).await?;
    execute(admin, "SELECT pg_reload_conf()").await
}

/// Runs `runs` with room for WAL, given back afterwards whether they succeed or not (else a
/// failed bench would leave the cluster's `max_wal_size` at 4 GB for the next). A run
/// interrupted (^C, SIGTERM) drops this future before that: `Cluster::start` gives it back.
pub(crate) async fn with_room_for_wal(
    admin: &tokio_postgres::Client,
    runs: impl std::future::Future<Output = Res<()>>,
) -> Res<()> {
    room_for_wal(admin, true).await?;
    let ran = runs.await;
    // A run's own error first: it is why the cluster may not answer now either.
    let back = room_for_wal(admin, false).await;
    ran.and(back)
}

pub(crate) async fn connect(url: &str) -> Res<tokio_postgres::Client> {
    let config: shared::db::Config = url.parse().map_err(|e| format!("{url}: {e}"))?;
    shared::db::connect(&config)
        .await
        .map_err(|e| format!("connecting to {url}: {}", shared::db::describe(&e)).into())
}

/// The first column of the first row of `sql`, as text (`::text` in the query where needed).
pub(crate) async fn scalar(client: &tokio_postgres::Client, sql: &str) -> Res<String> {
    let first = column(client, sql).await?.into_iter().next();
    first.ok_or_else(|| format!("{sql}: no row").into())
}

/// The first column of every row of `sql`, as text.
pub(crate) async fn column(client: &tokio_postgres::Client, sql: &str) -> Res<Vec<String>> {
    let rows = client
        .simple_query(sql)
        .await
        .map_err(|e| db_error(sql, &e))?;
    Ok(rows
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => {
                Some(row.get(0).unwrap_or("").to_owned())
            }
            _ => None,
        })
        .collect())
}

/// A number that `sql` returns.
pub(crate) async fn number(client: &tokio_postgres::Client, sql: &str) -> Res<i64> {
    let text = scalar(client, sql).await?;
    text.parse()
        .map_err(|_| format!("{sql}: {text:?} is not a number").into())
}

pub(crate) async fn execute(client: &tokio_postgres::Client, sql: &str) -> Res<()> {
    client
        .batch_execute(sql)
        .await
        .map_err(|e| db_error(sql, &e))
}

fn db_error(sql: &str, e: &tokio_postgres::Error) -> crate::Error {
    let first = sql.trim().lines().next().unwrap_or_default();
    format!("{first}: {}", shared::db::describe(e)).into()
}
