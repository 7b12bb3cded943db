//! A private PostgreSQL cluster for tests: one per test binary, started on first use with
//! `initdb` in a temp dir, reachable only through a Unix socket in that dir, and stopped
//! (and its dir removed) when the test binary exits, even if it is killed. [`tls_cluster`]
//! and [`tcp_cluster`] are two more, on loopback TCP, with and without TLS (a certificate
//! made at start by [`crate::testcerts`]), for the tests of `sslmode`.
//!
//! The cluster is supervised by a small shell process whose stdin is a pipe from the test
//! binary: when the test binary exits for any reason the pipe closes, and the shell stops
//! PostgreSQL and removes the directory. PostgreSQL refuses to run as root, so as root the
//! shell runs as the `postgres` user (or `$PGTEST_USER`).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// The server binaries a cluster needs (`pg_basebackup` for a standby: a directory that has
/// only links to the first two, as some images put on PATH, is passed over).
const NEEDED: [&str; 3] = ["initdb", "pg_ctl", "pg_basebackup"];

const SUPERVISOR: &str = r#"
set -e
if [ -n "$PRIMARY" ]; then
  "$BIN/pg_basebackup" -h "$PRIMARY" -U postgres -D "$DIR/data" -R -X stream -c fast \
    >"$DIR/initdb.log" 2>&1 || { cat "$DIR/initdb.log"; exit 1; }
else
  "$BIN/initdb" -D "$DIR/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 \
    || { cat "$DIR/initdb.log"; exit 1; }
fi
"$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 -o "-k $DIR $SERVER_OPTIONS $EXTRA_OPTIONS" \
  start >/dev/null || { cat "$DIR/server.log"; exit 1; }
echo ready
read _ || true
"$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
rm -rf "$DIR"
"#;

/// The server's options besides its socket directory; [`Cluster::start_server`] restarts with
/// the same ones. `wal_level=logical`: a test may subscribe one database to another's `links`.
const SERVER_OPTIONS: &str = "-c listen_addresses= -c fsync=off -c synchronous_commit=off \
     -c full_page_writes=off -c max_connections=300 -c wal_level=logical";

/// How a cluster is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Unix socket only: what every test but the TLS ones uses.
    Unix,
    /// Loopback TCP with `ssl=on` and a certificate for `localhost` and 127.0.0.1.
    Tls,
    /// Loopback TCP without TLS: a server that refuses `sslmode=require`.
    PlainTcp,
}

/// A running private cluster.
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    /// Options added to [`SERVER_OPTIONS`] (TCP port, TLS files).
    extra: String,
    /// The TCP port, for the TCP kinds.
    port: Option<u16>,
    /// The certificates the TLS kind's server uses.
    certs: Option<crate::testcerts::Certs>,
    next_db: AtomicU32,
    /// Held so the supervisor's stdin stays open for as long as the test binary lives.
    _supervisor: Mutex<Child>,
}

/// A fresh, empty database of its own for one test.
#[derive(Debug, Clone)]
pub struct TestDb {
    pub name: String,
    /// A libpq key=value connection string for it.
    pub url: String,
}

/// The cluster of this test binary, started on first call.
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::start(Kind::Unix).unwrap_or_else(|msg| panic!("{msg}")))
}

/// A cluster of this test binary on loopback TCP with TLS (`ssl=on`), started on first call.
/// Its certificate is for `localhost` and `127.0.0.1`, signed by [`Cluster::ca_file`].
pub fn tls_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::start(Kind::Tls).unwrap_or_else(|msg| panic!("{msg}")))
}

/// A cluster of this test binary on loopback TCP without TLS, started on first call.
pub fn tcp_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::start(Kind::PlainTcp).unwrap_or_else(|msg| panic!("{msg}")))
}

/// A TCP port free on 127.0.0.1 now (the kernel's pick; PostgreSQL binds it a moment later).
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free TCP port: {e}"))
}

impl Cluster {
    fn start(kind: Kind) -> Result<Cluster, String> {
        Cluster::start_from(kind, None)
    }

    /// Starts a cluster: a new one from `initdb`, or with `primary` (a Unix cluster's socket
    /// directory) a streaming standby of it, copied by `pg_basebackup -R`.
    fn start_from(kind: Kind, primary: Option<&Path>) -> Result<Cluster, String> {
        let bin = find_bindir().ok_or_else(|| match std::env::var("PGTEST_BINDIR") {
            Ok(named) => format!("PGTEST_BINDIR ({named}) lacks {}", NEEDED.join(", ")),
            Err(_) => format!(
                "PostgreSQL server binaries ({}) were not found on PATH, in `pg_config --bindir`, \
                 or under /usr/lib/postgresql/*/bin. Install them: `apt-get install postgresql` \
                 (Debian) and run the tests again.",
                NEEDED.join(", ")
            ),
        })?;
        let dir = tempfile::Builder::new()
            .prefix("pgtest-")
            .tempdir()
            .map_err(|e| format!("creating the cluster's temp dir: {e}"))?
            .keep();
        let port = match kind {
            Kind::Unix => None,
            Kind::Tls | Kind::PlainTcp => Some(free_port()?),
        };
        let mut extra = port
            .map(|p| format!("-c listen_addresses=127.0.0.1 -c port={p}"))
            .unwrap_or_default();
        let certs = match kind {
            Kind::Tls => {
                let certs = crate::testcerts::Certs::write(&dir)?;
                hand_to_server(&certs.server_key)?;
                extra.push_str(&format!(
                    " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                    certs.server_cert.display(),
                    certs.server_key.display()
                ));
                Some(certs)
            }
            Kind::Unix | Kind::PlainTcp => None,
        };
        let mut cmd = Command::new("sh");
        cmd.args(["-c", SUPERVISOR])
            .env("BIN", &bin)
            .env("DIR", &dir)
            .env("SERVER_OPTIONS", SERVER_OPTIONS)
            .env("EXTRA_OPTIONS", &extra)
            .env("PRIMARY", primary.map(Path::as_os_str).unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        run_unprivileged(&mut cmd, &dir)?;
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting the PostgreSQL supervisor shell: {e}"))?;
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let mut first = String::new();
        let _ = out.read_line(&mut first);
        if first.trim() != "ready" {
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut rest);
            return Err(format!("PostgreSQL did not start:\n{first}{rest}"));
        }
        Ok(Cluster {
            bin,
            dir,
            extra,
            port,
            certs,
            next_db: AtomicU32::new(0),
            _supervisor: Mutex::new(child),
        })
    }

    /// Stops the server (fast shutdown: open connections are cut), as an outage for tests of
    /// what happens while the database is away. Blocks until it is down.
    pub fn stop_server(&self) {
        self.pg_ctl(r#""$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop"#);
    }

    /// Starts the server again after [`Cluster::stop_server`], with the options it first had.
    /// Blocks until it accepts connections.
    pub fn start_server(&self) {
        self.pg_ctl(
            r#""$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 -o "-k $DIR $SERVER_OPTIONS $EXTRA_OPTIONS" start"#,
        );
    }

    /// `pg_ctl restart -m immediate`: the server is killed without a checkpoint, as in a crash,
    /// and recovers from its WAL at start. Blocks until it accepts connections again.
    pub fn restart_immediately(&self) {
        self.pg_ctl(
            r#""$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -m immediate -w -t 60 -o "-k $DIR $SERVER_OPTIONS $EXTRA_OPTIONS" restart"#,
        );
    }

    /// Runs a `pg_ctl` command line as the user the supervisor runs as; panics with its output
    /// if it fails.
    fn pg_ctl(&self, script: &str) {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script])
            .env("BIN", &self.bin)
            .env("DIR", &self.dir)
            .env("SERVER_OPTIONS", SERVER_OPTIONS)
            .env("EXTRA_OPTIONS", &self.extra)
            .stdin(Stdio::null());
        run_unprivileged(&mut cmd, &self.dir).unwrap_or_else(|e| panic!("{e}"));
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("running pg_ctl: {e}"));
        assert!(
            out.status.success(),
            "{script}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The directory holding the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// A libpq key=value connection string for database `db` as the superuser `postgres`
    /// (for the TCP kinds: on 127.0.0.1, `sslmode` left to its default, `prefer`).
    pub fn url(&self, db: &str) -> String {
        match self.port {
            None => format!("host={} user=postgres dbname={db}", self.dir.display()),
            Some(port) => format!("host=127.0.0.1 port={port} user=postgres dbname={db}"),
        }
    }

    /// The TCP port of a TCP cluster.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The PEM file of the CA that signed a TLS cluster's certificate (for `sslrootcert`).
    pub fn ca_file(&self) -> Option<&Path> {
        self.certs.as_ref().map(|c| c.ca_cert.as_path())
    }

    /// The PEM file of a CA that signed nothing this cluster uses (a wrong `sslrootcert`).
    pub fn other_ca_file(&self) -> Option<&Path> {
        self.certs.as_ref().map(|c| c.other_ca_cert.as_path())
    }

    /// Creates a new empty database that no other test uses.
    pub async fn fresh_database(&self) -> TestDb {
        self.fresh_database_with("").await
    }

    /// [`Cluster::fresh_database`] with `options` for `CREATE DATABASE` (an encoding, say).
    pub async fn fresh_database_with(&self, options: &str) -> TestDb {
        let name = format!("test_{}", self.next_db.fetch_add(1, Ordering::Relaxed));
        let admin = self.connect("postgres").await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name} {options}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        TestDb {
            url: self.url(&name),
            name,
        }
    }

    /// A client of database `db`, its connection driven by a spawned task.
    pub async fn connect(&self, db: &str) -> tokio_postgres::Client {
        connect(&self.url(db)).await
    }
}

/// The modes of migration 21's triggers on `links`, as "name letter" (`tgenabled`) by name.
pub async fn link_trigger_modes(client: &tokio_postgres::Client) -> Vec<String> {
    let sql = "SELECT tgname::text || ' ' || tgenabled::text FROM pg_trigger
               WHERE tgrelid = 'links'::regclass
                 AND tgname IN ('links_log_replicated', 'links_truncated', 'links_changed')
               ORDER BY tgname";
    strings(client, sql).await
}

/// What [`link_trigger_modes`] reads once migration 21's modes are in place.
pub const LINK_TRIGGER_MODES: [&str; 3] = [
    "links_changed A",
    "links_log_replicated R",
    "links_truncated A",
];

/// The first column of every row `sql` returns, as text.
pub async fn strings(client: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    let rows = client.query(sql, &[]).await;
    let rows = rows.unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.iter().map(|r| r.get(0)).collect()
}

/// Waits until every row of `link_changes` is of a transaction older than the oldest one
/// running in the cluster: only then may `prune_link_changes` delete it (migration 17), and
/// another test's transaction, in its own database of the same cluster, can hold that back.
pub async fn await_link_changes_prunable(client: &tokio_postgres::Client) {
    // Not max(xid): PostgreSQL has it only from 15 on.
    let prunable = "SELECT coalesce((SELECT xid FROM link_changes ORDER BY xid DESC LIMIT 1),
                                    '0'::xid8) < pg_snapshot_xmin(pg_current_snapshot())";
    crate::eventually(
        "every change logged older than any running",
        crate::LIMIT,
        || async {
            let row = client
                .query_one(prunable, &[])
                .await
                .expect("the prunable check");
            row.get::<_, bool>(0).then_some(())
        },
    )
    .await;
}

/// Connects to `url`, panicking with the reason if it cannot; for tests.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let config: shared::db::Config = url.parse().unwrap_or_else(|e| panic!("parsing {url}: {e}"));
    shared::db::connect(&config)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {}", shared::db::describe(&e)))
}

/// A session to `url` as the database gives it, not set up as the services' sessions are
/// (`shared::db::Config::set_up`): the database's and the role's settings, timeouts among them.
pub async fn connect_as_given(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {}", shared::db::describe(&e)));
    tokio::spawn(connection);
    client
}

/// As root, the unprivileged user PostgreSQL runs as (`postgres`, or `$PGTEST_USER`); else
/// none: it runs as we do.
fn server_user() -> Result<Option<nix::unistd::User>, String> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let name = std::env::var("PGTEST_USER").unwrap_or_else(|_| "postgres".into());
    let user = nix::unistd::User::from_name(&name)
        .ok()
        .flatten()
        .ok_or_else(|| {
            format!(
                "running as root, and PostgreSQL refuses to: no user `{name}` to run it as. \
                 Create one (Debian's postgresql package does) or set PGTEST_USER."
            )
        })?;
    Ok(Some(user))
}

/// Gives `path` to the user the server runs as (it refuses a key file it does not own).
fn hand_to_server(path: &Path) -> Result<(), String> {
    if let Some(user) = server_user()? {
        nix::unistd::chown(path, Some(user.uid), Some(user.gid))
            .map_err(|e| format!("chown {} to {}: {e}", path.display(), user.name))?;
    }
    Ok(())
}

/// As root, hands `dir` to an unprivileged user and makes `cmd` run as that user.
fn run_unprivileged(cmd: &mut Command, dir: &Path) -> Result<(), String> {
    let Some(user) = server_user()? else {
        return Ok(());
    };
    hand_to_server(dir)?;
    cmd.uid(user.uid.as_raw())
        .gid(user.gid.as_raw())
        .current_dir(dir);
    Ok(())
}

/// Where `initdb` and `pg_ctl` are: `$PGTEST_BINDIR` alone when set (`scripts/test-server-
/// versions` names each server's: a directory without them is not passed over for another
/// server's), else PATH, then `pg_config --bindir`, then the newest `/usr/lib/postgresql/*/bin`.
pub fn find_bindir() -> Option<PathBuf> {
    let has_all = |dir: &Path| NEEDED.iter().all(|b| dir.join(b).is_file());
    if let Some(named) = std::env::var_os("PGTEST_BINDIR") {
        let named = PathBuf::from(named);
        return has_all(&named).then(|| std::fs::canonicalize(&named).unwrap_or(named));
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    let pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let mut versioned: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .collect();
    versioned.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    on_path
        .chain(pg_config)
        .chain(versioned.into_iter().rev())
        .find(|d| has_all(d))
        .map(|d| std::fs::canonicalize(&d).unwrap_or(d))
}

/// A fresh database of the test cluster with every migration applied, for tests.
pub async fn test_db() -> TestDb {
    test_db_on(cluster()).await
}

/// A fresh database of `cluster` with every migration applied, for tests.
pub async fn test_db_on(cluster: &Cluster) -> TestDb {
    migrated(cluster.fresh_database().await).await
}

/// `db` with every migration applied.
pub async fn migrated(db: TestDb) -> TestDb {
    let mut client = connect(&db.url).await;
    schema::apply(&mut client)
        .await
        .unwrap_or_else(|e| panic!("migrating {}: {e}", db.name));
    db
}

/// How a [`Pair`]'s primary waits for its standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names = '*'`: a commit returns once the standby has flushed it.
    Synchronous,
    /// A commit returns at once; the standby follows when it can.
    Asynchronous,
}

/// A primary and a streaming hot standby of it (`pg_basebackup -R`), each a private cluster
/// on a Unix socket of its own, for the failover tests. Unlike [`cluster`], each test makes
/// its own: they kill and promote.
pub struct Pair {
    pub primary: Cluster,
    pub standby: Cluster,
}

impl Pair {
    /// Starts the primary, sets its replication mode, copies it into the standby and waits
    /// until the standby streams (and, synchronous, is the synchronous one). The setting is
    /// made before the copy, so the standby inherits `synchronous_standby_names` as a real
    /// one does (`postgresql.auto.conf` is copied): promoted, it waits for a standby of its
    /// own until the setting is cleared.
    pub async fn start(mode: Replication) -> Pair {
        let primary = Cluster::start(Kind::Unix).unwrap_or_else(|msg| panic!("{msg}"));
        if mode == Replication::Synchronous {
            primary.set_synchronous_standby_names("*").await;
        }
        let from = primary.dir.clone();
        let standby = tokio::task::spawn_blocking(move || {
            Cluster::start_from(Kind::Unix, Some(&from)).unwrap_or_else(|msg| panic!("{msg}"))
        })
        .await
        .expect("starting the standby");
        let pair = Pair { primary, standby };
        let state = match mode {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        let admin = pair.primary.connect("postgres").await;
        crate::eventually(
            &format!("the standby to stream as {state}"),
            crate::LIMIT,
            || async {
                let states = strings(&admin, "SELECT sync_state FROM pg_stat_replication").await;
                (states == [state]).then_some(())
            },
        )
        .await;
        pair
    }

    /// A connection string naming both servers, primary first, that connects to whichever
    /// accepts writes (libpq's multi-host form with `target_session_attrs=read-write`): what
    /// the services are given so that they follow a failover.
    pub fn url(&self, db: &str) -> String {
        format!(
            "host={},{} user=postgres dbname={db} target_session_attrs=read-write",
            self.primary.dir.display(),
            self.standby.dir.display()
        )
    }

    /// Waits until `sql` (one boolean) is true in database `db` on the standby: for a test
    /// that needs a write of the primary readable there, the condition itself rather than a
    /// WAL position. With `synchronous_commit=off` (the clusters' `SERVER_OPTIONS`) a commit
    /// returns while its record may still be in the primary's WAL buffers, past
    /// `pg_current_wal_lsn()`: a wait for that position returned once before the commit was
    /// replayed. A database or table not replayed yet is waited for; any other error fails.
    pub async fn await_on_standby(&self, db: &str, sql: &str) {
        use tokio_postgres::error::SqlState;
        let url = self.standby.url(db);
        let config: shared::db::Config = url.parse().unwrap_or_else(|e| panic!("{url}: {e}"));
        let query = format!("SELECT ({sql})::text");
        let what = format!("the standby to answer true to {sql} in database {db}");
        crate::eventually(&what, crate::LIMIT, || async {
            // Connected each time: the database itself may not be replayed yet.
            let standby = shared::db::connect(&config).await.ok()?;
            match standby.query_one(&query, &[]).await {
                Ok(row) => (row.get::<_, Option<&str>>(0) == Some("true")).then_some(()),
                Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => None,
                Err(e) => panic!("{query} on the standby: {}", shared::db::describe(&e)),
            }
        })
        .await;
    }
}

/// The pid of the postmaster of the cluster in `dir` (its data directory in `dir/data`), from
/// `postmaster.pid`.
pub fn postmaster_pid(dir: &std::path::Path) -> i32 {
    let file = dir.join("data/postmaster.pid");
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
    text.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {}: {text:?}", file.display()))
}

impl Cluster {
    /// The postmaster's pid, from `postmaster.pid`.
    pub fn postmaster_pid(&self) -> i32 {
        postmaster_pid(&self.dir)
    }

    /// Kills the server as a machine that dies would: SIGKILL to the postmaster and every
    /// process of it at once, no shutdown, no checkpoint, nothing more sent to a standby.
    /// Returns once they are all gone. The cluster is not usable afterwards.
    pub fn kill_hard(&self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let postmaster = self.postmaster_pid();
        let mut pids = children_of(postmaster);
        pids.push(postmaster);
        for &pid in &pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let deadline = std::time::Instant::now() + crate::LIMIT;
        // A killed child stays a zombie until the supervisor shell (the postmaster's
        // parent's parent, by then) reaps it: gone from the server's point of view.
        let alive = |pid: i32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                !s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
        };
        while pids.iter().any(|&p| alive(p)) {
            assert!(
                std::time::Instant::now() < deadline,
                "the killed server's processes {pids:?} did not go"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// `pg_ctl promote`: a standby becomes a primary. Blocks until it accepts writes.
    pub fn promote(&self) {
        self.pg_ctl(r#""$BIN/pg_ctl" -D "$DIR/data" -w -t 60 promote"#);
    }

    /// `ALTER SYSTEM SET synchronous_standby_names` and a reload: `*` makes every commit wait
    /// for a standby; an empty one lets commits go on (and releases those waiting).
    pub async fn set_synchronous_standby_names(&self, value: &str) {
        let admin = self.connect("postgres").await;
        // Two statements: ALTER SYSTEM refuses to run in the implicit transaction of one
        // query string holding both.
        let set = format!("ALTER SYSTEM SET synchronous_standby_names = '{value}'");
        for sql in [set.as_str(), "SELECT pg_reload_conf()"] {
            admin
                .batch_execute(sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {}", shared::db::describe(&e)));
        }
    }

    /// The pid of a standby's WAL receiver.
    pub async fn wal_receiver_pid(&self) -> i32 {
        let admin = self.connect("postgres").await;
        crate::eventually("the standby's WAL receiver", crate::LIMIT, || async {
            let rows = admin
                .query("SELECT pid FROM pg_stat_wal_receiver", &[])
                .await
                .ok()?;
            rows.first().map(|r| r.get::<_, i32>(0))
        })
        .await
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) a standby's WAL receiver: stopped, it takes
    /// nothing more from the primary, which (replicating asynchronously) commits on.
    pub fn signal_wal_receiver(&self, pid: i32, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .unwrap_or_else(|e| panic!("{signal} to the WAL receiver {pid}: {e}"));
    }
}

/// The pids of the processes whose parent is `parent`, from `/proc` (a postmaster's backends,
/// say).
pub fn children_of(parent: i32) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
        if ppid == Some(parent) {
            pids.push(pid);
        }
    }
    pids
}
