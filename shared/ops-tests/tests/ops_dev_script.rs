//! `scripts/dev` run as a newcomer would, from the repository root: it builds, starts
//! PostgreSQL, the collector and the redirector, prints what to try; what it prints works; a
//! SIGTERM stops everything with exit 0 and leaves no process behind; a second run reuses the
//! data. Only the ports (0: free ones) and the data dir (a temp dir) are overridden, so the test
//! collides with nothing. Its PostgreSQL is the developer's alone, whoever runs the script: root
//! (PostgreSQL then runs as `postgres`) or a normal user.

use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::User;
use testkit::pgtest::children_of;
use testkit::{eventually, Service};

/// The first run builds the release binaries (fat LTO, but in `.ci/run`) on two cores.
const FIRST_READY: Duration = Duration::from_secs(15 * 60);
const READY: Duration = Duration::from_secs(180);
const STOP: Duration = Duration::from_secs(90);
const COUNTED: Duration = Duration::from_secs(30);
const CODE: &str = "seed42";
/// An unprivileged account every Debian system has, standing in for a developer's own: not
/// `postgres`, so that its way in is the cluster's peer map, not the same name.
const DEVELOPER: &str = "daemon";
/// Another local user, who must not reach the developer's cluster.
const OTHER: &str = "nobody";

fn repo() -> PathBuf {
    testkit::repo()
}

/// `scripts/dev` with its stdout folded into the captured stderr.
fn start(dev_dir: &Path) -> Service {
    let mut cmd = dev_command(dev_dir);
    cmd.env_remove("DATABASE_URL");
    Service::spawn("dev", cmd)
}

/// The script from the repository root, on free ports, with its data in `dev_dir`.
fn dev_command(dev_dir: &Path) -> Command {
    dev_command_as(dev_dir, "exec ./scripts/dev 1>&2")
}

/// [`dev_command`] with this command line of bash's (a pipeline's status is the script's
/// if it failed: `pipefail`).
fn dev_command_as(dev_dir: &Path, line: &str) -> Command {
    let mut cmd = Command::new("bash");
    // The script builds the release binaries with cargo.
    testkit::without_test_env(&mut cmd);
    cmd.args(["-o", "pipefail", "-c", line])
        .current_dir(repo())
        .env("DEV_DIR", dev_dir)
        .env("DEV_LISTEN", "127.0.0.1:0")
        .env("DEV_ADMIN", "127.0.0.1:0")
        .env("DEV_COLLECTOR_ADMIN", "127.0.0.1:0");
    cmd
}

/// A wait that is no whole number of seconds is refused before anything starts (bash took
/// `abc` for 0, and `2m` failed inside a later wait, blaming a process that had started).
#[test]
fn dev_script_refuses_a_wait_that_is_no_number_of_seconds() {
    let dir = tempfile::tempdir().unwrap();
    for wait in ["abc", "2m", "0", "-5"] {
        let out = dev_command(dir.path())
            .env("DEV_WAIT", wait)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "DEV_WAIT={wait}: {said}");
        assert!(said.contains("DEV_WAIT is a whole number"), "{said}");
        assert!(!dir.path().join("pg").exists(), "nothing started");
    }
}

/// What the script printed once ready: the addresses, the psql command, the pids it started.
struct Ready {
    redirect: SocketAddr,
    psql: String,
    metrics: Vec<SocketAddr>,
    pids: Vec<i32>,
}

/// The first `host:port` after `prefix` in `line`.
/// A server forked an instant before a Ctrl-C (passed on by `pg_ctl start` too early for it, or
/// ending pg_ctl just after its fork) has not written postmaster.pid yet, so `pg_ctl status`
/// says stopped: the stop at the end took it for stopped and left it running. Here a real
/// server is started 2 s late by a process whose arguments name its data directory, as
/// pg_ctl's fork does, and `pg_stop_if_running` (what the end of `scripts/dev` calls) must
/// wait for it and stop it.
#[test]
fn a_server_in_its_start_before_its_pid_file_is_stopped_not_left_running() {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let script = r#"
        set -eu
        . scripts/lib/pg.sh
        PGDIR=$DIR/pg
        PGBIN=$(pg_bindir)
        pg_prepare "$DIR/pg.log"
        pg_initdb "$DIR/initdb.log"
        pg_access
        as_pg sh -c 'sleep 2; exec "$1/postgres" -D "$2" -k "$3" -c listen_addresses= >>"$4" 2>&1'             sh "$PGBIN" "$PGDIR/data" "$PGDIR" "$DIR/pg.log" &
        server=$!
        for _ in $(seq 50); do pg_forked && break; sleep 0.02; done
        pg_forked || { echo "the late start is not seen"; exit 1; }
        pg_stopped || { echo "postmaster.pid written already: nothing tested"; exit 1; }
        pg_stop_if_running
        # The server's process ends once stopped; left running, it is still there in 15 s.
        for _ in $(seq 150); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$server" 2>/dev/null; then
            echo "left running"
            as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" -m immediate -w stop >/dev/null 2>&1 || true
            exit 1
        fi
        echo stopped
    "#;
    let out = Command::new("bash")
        .args(["-c", script])
        .current_dir(repo())
        .env("DIR", dir.path())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && printed.trim_end().ends_with("stopped"),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn addr_after(line: &str, prefix: &str) -> SocketAddr {
    let rest = &line[line.find(prefix).expect("prefix") + prefix.len()..];
    let addr = rest.split('/').next().unwrap_or_default();
    addr.parse()
        .unwrap_or_else(|e| panic!("no address in {line:?}: {e}"))
}

fn pid_after(line: &str, marker: &str) -> i32 {
    let rest = &line[line
        .find(marker)
        .unwrap_or_else(|| panic!("{marker:?} in {line:?}"))
        + marker.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid after {marker:?} in {line:?}"))
}

async fn wait_ready(run: &Service, limit: Duration) -> Ready {
    let line = run.wait_for_log("dev: ready", limit).await;
    let log = run.log();
    let find = |needle: &str| {
        log.iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("the script printed no line with {needle:?}"))
            .clone()
    };
    let metrics = log
        .iter()
        .filter(|l| l.contains("/metrics"))
        .map(|l| addr_after(l, "http://"))
        .collect();
    Ready {
        redirect: addr_after(&find("curl -si http://"), "http://"),
        psql: find("click_totals").trim().to_owned(),
        metrics,
        pids: vec![
            run.pid().as_raw(),
            pid_after(&line, "collector pid "),
            pid_after(&line, "redirector pid "),
        ],
    }
}

/// GET `path`: the status and the Location header.
async fn get(addr: SocketAddr, path: &str) -> (u16, Option<String>) {
    let response = testkit::http::request(addr, hyper::Method::GET, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"));
    let location = response.headers().get("location");
    let location = location.map(|l| l.to_str().expect("a text Location").to_owned());
    (response.status().as_u16(), location)
}

/// The clicks `psql_line` (the command the script printed) shows for CODE, if any.
fn clicks_shown(psql_line: &str) -> Option<i64> {
    let out = Command::new("sh")
        .args(["-c", psql_line])
        .output()
        .expect("running the printed psql command");
    assert!(
        out.status.success(),
        "the printed command failed: {psql_line}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        (cells.first() == Some(&CODE)).then(|| cells.last()?.parse().ok())?
    })
}

/// `cmd` run as `user` (its own uid, gid and groups), through setpriv; root only.
fn as_user(user: &str, cmd: &Command) -> Command {
    let account = User::from_name(user)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no user {user} on this system"));
    let ids = [
        format!("--reuid={}", account.uid),
        format!("--regid={}", account.gid),
        "--init-groups".into(),
        "--".into(),
    ];
    testkit::wrapped("setpriv", &ids, cmd)
}

/// psql beside the server binaries, or else on PATH.
fn psql() -> PathBuf {
    testkit::pgtest::find_bindir()
        .map(|dir| dir.join("psql"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| "psql".into())
}

/// The libpq connection string of database `clicks` on the cluster whose socket is in `dir`
/// (quoted: the test's directories hold a space).
fn clicks_url(dir: &Path) -> String {
    format!("host='{}' user=postgres dbname=clicks", dir.display())
}

/// `SELECT current_user` on the dev cluster in `dev_dir` as the superuser `postgres`, by
/// `user` (or this process): what psql printed, or why it failed.
fn connect_as(user: Option<&str>, dev_dir: &Path) -> Result<String, String> {
    let url = clicks_url(&dev_dir.join("pg"));
    let mut cmd = Command::new(psql());
    cmd.args(["-X", "-tA", "-d", &url, "-c", "SELECT current_user"])
        .env("HOME", dev_dir)
        .current_dir("/");
    let mut cmd = match user {
        Some(user) => as_user(user, &cmd),
        None => cmd,
    };
    let out = cmd.output().expect("running psql");
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_owned();
    if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        Err(text(&out.stderr))
    }
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// The running dev cluster in `dev_dir` is closed to everyone but `developer` (`None`: this
/// process) and the server's user: (as root, who can act as another user) another user's psql
/// is refused while the developer's gets in; its socket's directory and the socket are 0700;
/// it authenticates by peer, never trust.
fn assert_cluster_kept_to(developer: Option<&str>, dev_dir: &Path) {
    if nix::unistd::geteuid().is_root() {
        let other = connect_as(Some(OTHER), dev_dir);
        assert!(
            other.is_err(),
            "{OTHER} connected to the developer's cluster as its superuser: {other:?}"
        );
        assert_eq!(
            connect_as(developer, dev_dir).as_deref(),
            Ok("postgres"),
            "the developer ({}) cannot reach their own cluster",
            developer.unwrap_or("root")
        );
    }
    let pg = dev_dir.join("pg");
    assert_eq!(mode(&pg), 0o700, "{} is open to others", pg.display());
    let socket = pg.join(".s.PGSQL.5432");
    assert_eq!(
        mode(&socket),
        0o700,
        "{} is open to others",
        socket.display()
    );
    let hba = fs::read_to_string(pg.join("data/pg_hba.conf")).expect("pg_hba.conf");
    let rules: Vec<&str> = hba
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    // Replication too (DEV_STANDBY=1's standby), under the same rule: the socket, peers of the map.
    assert_eq!(
        rules,
        [
            "local all all peer map=dev",
            "local replication all peer map=dev"
        ],
        "pg_hba.conf:\n{hba}"
    );
}

/// `/proc/PID/stat` fields after the command name: state, ppid, ...
fn stat(pid: i32) -> Option<Vec<String>> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &text[text.rfind(')')? + 1..];
    Some(after_name.split_whitespace().map(str::to_owned).collect())
}

/// Running (a zombie has finished: it only waits for its parent to read its status).
fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|fields| fields[0] != "Z")
}

fn all_pids() -> Vec<i32> {
    fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Live processes whose command line names `dir`, with that command line.
fn mentioning(dir: &Path) -> Vec<(i32, String)> {
    let needle = dir.to_string_lossy().into_owned();
    all_pids()
        .into_iter()
        .filter(|&pid| alive(pid))
        .filter_map(|pid| {
            let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmdline.contains(&needle).then_some((pid, cmdline))
        })
        .collect()
}

/// Every process of a run: `started` (the script, what it printed it started), each running,
/// PostgreSQL's postmaster (from its pid file) and the postmaster's children.
fn processes_of(started: &[i32], dev_dir: &Path) -> Vec<i32> {
    let postmaster = testkit::pgtest::postmaster_pid(&dev_dir.join("pg"));
    let mut pids = started.to_vec();
    pids.push(postmaster);
    for &pid in &pids {
        assert!(
            alive(pid),
            "process {pid} of the running pipeline is not running"
        );
    }
    // Not checked: a backend may come and go at any moment.
    pids.extend(children_of(postmaster));
    pids
}

/// The pid in a run's `<name>.pid`, if it has one.
fn pid_file(dev_dir: &Path, name: &str) -> Option<i32> {
    let text = fs::read_to_string(dev_dir.join(format!("{name}.pid"))).ok()?;
    text.trim().parse().ok()
}

/// A run's data dir, in a temp dir of its own. Dropped after a failed assertion, it first kills
/// whatever of the run is still up, so a failing test does not leave PostgreSQL running.
struct DevDir {
    temp: tempfile::TempDir,
}

impl DevDir {
    fn new() -> DevDir {
        let temp = tempfile::Builder::new()
            .prefix("dev-script-")
            .tempdir()
            .expect("temp dir");
        // As root the script runs PostgreSQL as `postgres`, which must be able to enter it.
        fs::set_permissions(temp.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        DevDir { temp }
    }

    /// With a space: the script quotes every path it builds.
    fn path(&self) -> PathBuf {
        self.temp.path().join("dev dir")
    }
}

impl Drop for DevDir {
    fn drop(&mut self) {
        // The script itself names the dir in its environment only; its pid file says it (if
        // that pid is still a bash, as the script's own check has it).
        if let Some(pid) = pid_file(&self.path(), "dev") {
            let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            if exe.to_string_lossy().ends_with("/bash") {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        for (pid, _) in mentioning(&self.path()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Sends SIGTERM, expects exit 0, the final lines, and no process of the run left.
async fn stop(mut run: Service, pids: &[i32], dev_dir: &Path, final_lines: &[&str]) {
    run.signal(Signal::SIGTERM);
    let status = run.wait_exit(STOP).await;
    assert!(
        status.success(),
        "scripts/dev exited with {status} after SIGTERM"
    );
    let log = run.log();
    for expected in final_lines {
        assert!(
            log.iter().any(|l| l.contains(expected)),
            "scripts/dev did not print {expected:?} at the end"
        );
    }
    assert_none_left(pids, dev_dir);
}

/// None of `pids` is running, nor any process naming `dev_dir`.
fn assert_none_left(pids: &[i32], dev_dir: &Path) {
    let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "processes left running: {left:?}");
    let named = mentioning(dev_dir);
    assert!(
        named.is_empty(),
        "processes naming the dev dir left running: {named:?}"
    );
}

#[tokio::test]
async fn dev_script_redirects_counts_stops_cleanly_and_reuses_its_data() {
    let dir = DevDir::new();
    let dev_dir = dir.path();

    let run = start(&dev_dir);
    let ready = wait_ready(&run, FIRST_READY).await;
    for pid in &ready.pids[1..] {
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        assert!(
            ["collector", "redirector"].contains(&comm.trim()),
            "printed pid {pid} is {comm:?}, not a binary of the pipeline"
        );
    }
    assert_cluster_kept_to(None, &dev_dir);
    // A second run in the same directory is refused, and leaves the first one running (it
    // took the first's processes for leftovers, and stopped them).
    let mut second = start(&dev_dir);
    let status = second.wait_exit(STOP).await;
    assert!(!status.success(), "a second run in {dev_dir:?}: {status}");
    let said = second.log().join("\n");
    assert!(said.contains("another scripts/dev"), "{said}");
    let (status, location) = get(ready.redirect, &format!("/{CODE}")).await;
    assert_eq!(status, 302, "GET /{CODE} on the printed address");
    assert_eq!(location.as_deref(), Some("https://example.com/42"));
    let shown = eventually(
        "the printed psql command to show the click",
        COUNTED,
        || async { clicks_shown(&ready.psql).filter(|&n| n >= 1) },
    )
    .await;
    assert_eq!(shown, 1, "one redirect, one click");
    assert_eq!(ready.metrics.len(), 2, "two metrics URLs printed");
    for addr in &ready.metrics {
        let (status, body) = testkit::http::get(*addr, "/metrics")
            .await
            .expect("metrics");
        assert_eq!(status, 200, "GET http://{addr}/metrics");
        assert!(!body.is_empty());
    }
    let pids = processes_of(&ready.pids, &dev_dir);
    stop(
        run,
        &pids,
        &dev_dir,
        &[
            "redirector: 1 clicks sent, 0 dropped",
            "collector: 1 clicks written",
        ],
    )
    .await;

    // A second run finds the cluster, the links and the click of the first one.
    let again = start(&dev_dir);
    let ready = wait_ready(&again, READY).await;
    assert!(
        again
            .log()
            .iter()
            .any(|l| l.contains("links already present")),
        "the second run seeded the links again"
    );
    assert_eq!(clicks_shown(&ready.psql), Some(1), "the first run's click");
    let db = testkit::pgtest::connect(&clicks_url(&dev_dir.join("pg"))).await;
    let links: i64 = db
        .query_one("SELECT count(*) FROM links", &[])
        .await
        .expect("count links")
        .get(0);
    assert_eq!(links, 250_000);
    drop(db);
    let pids = processes_of(&ready.pids, &dev_dir);
    stop(
        again,
        &pids,
        &dev_dir,
        &[
            "redirector: 0 clicks sent, 0 dropped",
            "collector: 0 clicks written",
        ],
    )
    .await;
}

/// `DEV_STANDBY=1`: a synchronous standby beside the cluster; a click is committed on both,
/// and a stop stops both servers.
#[tokio::test]
async fn dev_script_with_a_standby_commits_on_both_and_stops_both() {
    let dir = DevDir::new();
    let dev_dir = dir.path();
    let mut cmd = dev_command(&dev_dir);
    cmd.env_remove("DATABASE_URL").env("DEV_STANDBY", "1");
    let run = Service::spawn("dev", cmd);
    let ready = wait_ready(&run, FIRST_READY).await;
    run.wait_for_log("the standby replicates synchronously", READY)
        .await;
    let (status, _) = get(ready.redirect, &format!("/{CODE}")).await;
    assert_eq!(status, 302, "GET /{CODE} on the printed address");
    let shown = eventually("the click to be counted", COUNTED, || async {
        clicks_shown(&ready.psql).filter(|&n| n >= 1)
    })
    .await;
    assert_eq!(shown, 1, "one redirect, one click");

    let url = |dir: &str| clicks_url(&dev_dir.join(dir));
    let primary = testkit::pgtest::connect(&url("pg")).await;
    let sync =
        testkit::pgtest::strings(&primary, "SELECT sync_state FROM pg_stat_replication").await;
    assert_eq!(sync, ["sync"], "one synchronous standby");
    let standby = testkit::pgtest::connect(&url("pg-standby")).await;
    let clicks = eventually(
        "the click to be replayed on the standby",
        COUNTED,
        || async {
            let row = standby
                .query_one("SELECT pg_is_in_recovery(), count(*) FROM clicks", &[])
                .await
                .ok()?;
            Some((row.get::<_, bool>(0), row.get::<_, i64>(1))).filter(|&(_, n)| n >= 1)
        },
    )
    .await;
    assert_eq!(
        clicks,
        (true, 1),
        "the standby, in recovery, holds the click"
    );
    drop((primary, standby));

    let mut pids = processes_of(&ready.pids, &dev_dir);
    let standby_postmaster = testkit::pgtest::postmaster_pid(&dev_dir.join("pg-standby"));
    pids.push(standby_postmaster);
    pids.extend(children_of(standby_postmaster));
    stop(
        run,
        &pids,
        &dev_dir,
        &["stopping the standby", "collector: 1 clicks written"],
    )
    .await;
}

/// `DATABASE_URL` set: the script migrates and seeds that database, starts no PostgreSQL of its
/// own, and leaves that database running when it stops. With `RUST_LOG=warn`, which leaves out
/// the info lines the script reads (where the services listen, their final counts).
#[tokio::test]
async fn dev_script_uses_the_database_url_it_is_given() {
    let dir = DevDir::new();
    let dev_dir = dir.path();
    let cluster = testkit::pgtest::cluster();
    let db = cluster.fresh_database().await;

    let mut cmd = dev_command(&dev_dir);
    cmd.env("DATABASE_URL", &db.url).env("RUST_LOG", "warn");
    let run = Service::spawn("dev", cmd);
    let ready = wait_ready(&run, FIRST_READY).await;
    assert!(
        !dev_dir.join("pg").exists(),
        "the script set up a PostgreSQL of its own"
    );
    let (status, _) = get(ready.redirect, "/seed249999").await;
    assert_eq!(status, 302, "a seeded link of the given database");
    stop(
        run,
        &ready.pids,
        &dev_dir,
        &["redirector: 1 clicks sent, 0 dropped"],
    )
    .await;

    let client = cluster.connect(&db.name).await;
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM links), (SELECT count(*) FROM clicks)",
            &[],
        )
        .await
        .expect("the given database is still up");
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (250_000, 1));

    // A run that fails before it starts a service says nothing of the run before's counts,
    // whose logs are still there.
    let mut cmd = dev_command(&dev_dir);
    cmd.env("DATABASE_URL", "postgres://clicks@127.0.0.1:1/nothing");
    let mut failed = Service::spawn("dev", cmd);
    assert!(!failed.wait_exit(FIRST_READY).await.success());
    let log = failed.log();
    assert!(
        log.iter().any(|l| l.contains("migrations failed")),
        "{log:#?}"
    );
    assert!(
        !log.iter().any(|l| l.contains("dev: final:")),
        "a final line of another run: {log:#?}"
    );
}

/// A run killed with SIGKILL leaves the binaries and PostgreSQL running (they live in sessions
/// of their own); the next run stops them first instead of failing on the taken socket. The
/// killed run had a standby (`DEV_STANDBY=1`) and the next has none: it stops that too.
#[tokio::test]
async fn dev_script_after_sigkill_stops_what_the_killed_run_left() {
    let dir = DevDir::new();
    let dev_dir = dir.path();

    let mut cmd = dev_command(&dev_dir);
    cmd.env_remove("DATABASE_URL").env("DEV_STANDBY", "1");
    let mut killed = Service::spawn("dev", cmd);
    let first = wait_ready(&killed, FIRST_READY).await;
    let standby = testkit::pgtest::postmaster_pid(&dev_dir.join("pg-standby"));
    killed.signal(Signal::SIGKILL);
    killed.wait_exit(STOP).await;
    let orphans = &first.pids[1..];
    assert!(
        orphans.iter().all(|&p| alive(p)) && alive(standby),
        "the binaries and the standby should outlive a SIGKILLed script"
    );

    let again = start(&dev_dir);
    let ready = wait_ready(&again, READY).await;
    assert!(!alive(standby), "the killed run's standby still runs");
    for name in ["redirector", "collector", "standby"] {
        let expected = format!("stopping the {name} an earlier run left running");
        assert!(
            again.log().iter().any(|l| l.contains(&expected)),
            "the second run did not say {expected:?}"
        );
    }
    let left: Vec<i32> = orphans.iter().copied().filter(|&p| alive(p)).collect();
    assert!(
        left.is_empty(),
        "the killed run's processes still run: {left:?}"
    );
    let (status, _) = get(ready.redirect, "/seed1").await;
    assert_eq!(status, 302);
    let pids = processes_of(&ready.pids, &dev_dir);
    stop(
        again,
        &pids,
        &dev_dir,
        &["redirector: 1 clicks sent, 0 dropped"],
    )
    .await;
}

/// Its output read no further than the first line (`scripts/dev | head -n 1`): each later
/// line's write fails, and the run goes on (SIGPIPE killed it at the next line, leaving what
/// it had started running, with nothing said); a SIGTERM then stops everything.
#[tokio::test]
async fn dev_script_whose_output_is_closed_runs_on_and_stops_cleanly() {
    let dir = DevDir::new();
    let dev_dir = dir.path();
    let mut cmd = dev_command_as(&dev_dir, "./scripts/dev | head -n 1 >&2");
    cmd.env_remove("DATABASE_URL");
    let mut run = Service::spawn("dev | head", cmd);
    let log = dev_dir.join("redirector.log");
    let redirect = eventually("the redirector listening", FIRST_READY, || async {
        let ended = !alive(run.pid().as_raw());
        assert!(
            !ended,
            "scripts/dev | head ended before the redirector listened"
        );
        let text = fs::read_to_string(&log).ok()?;
        let line = text.lines().find(|l| l.contains("http listening on "))?;
        Some(addr_after(line, "http listening on "))
    })
    .await;
    eventually("a redirect served", READY, || async {
        (get(redirect, "/seed1").await.0 == 302).then_some(())
    })
    .await;
    let pid_of = |name| pid_file(&dev_dir, name).unwrap_or_else(|| panic!("no {name}.pid"));
    let script = pid_of("dev");
    assert!(alive(script), "scripts/dev exited with its output closed");
    let pids = processes_of(
        &[script, pid_of("collector"), pid_of("redirector")],
        &dev_dir,
    );
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(script), Signal::SIGTERM).unwrap();
    // 0 once it would have said it is ready, 130 before (a stop during the start): nothing
    // read tells which, the line saying so unread. Not 141 (SIGPIPE), nor 1.
    let status = run.wait_exit(STOP).await.code();
    assert!(
        matches!(status, Some(0 | 130)),
        "scripts/dev exited with {status:?}"
    );
    assert_none_left(&pids, &dev_dir);
}

/// Run by a normal user (here `daemon`, by root through setpriv), the script gives PostgreSQL
/// the same closed doors as under root: the user's own cluster takes the user and nobody else
/// (without that, any local user was its superuser, and could run programs as the developer
/// through `COPY ... TO PROGRAM`). The pipeline works as usual. The release binaries are
/// built first, as root, as the script would: the account has no Rust toolchain of its own.
/// Needs root (CI runs as root), to run the script as another user.
#[tokio::test]
async fn dev_script_run_by_a_normal_user_keeps_its_cluster_to_that_user() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "running the script as another user needs root (CI runs as root)"
    );
    let built = testkit::cargo()
        .args([
            "build",
            "--release",
            "--bin",
            "collector",
            "--bin",
            "redirector",
        ])
        .current_dir(repo())
        .status()
        .expect("running cargo build");
    assert!(built.success(), "cargo build --release failed");

    let dir = DevDir::new();
    let dev_dir = dir.path();
    let developer = User::from_name(DEVELOPER).unwrap().expect(DEVELOPER);
    fs::create_dir(&dev_dir).expect("mkdir dev dir");
    nix::unistd::chown(&dev_dir, Some(developer.uid), Some(developer.gid)).expect("chown");

    let mut cmd = dev_command(&dev_dir);
    cmd.env_remove("DATABASE_URL")
        .env("HOME", &dev_dir)
        // Built above; `true build ...` succeeds without building.
        .env("CARGO", "true");
    let run = Service::spawn("dev", as_user(DEVELOPER, &cmd));
    let ready = wait_ready(&run, READY).await;
    let owner = fs::metadata(dev_dir.join("pg/data")).expect("data dir");
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&owner),
        developer.uid.as_raw(),
        "PostgreSQL does not run as the developer"
    );
    assert_cluster_kept_to(Some(DEVELOPER), &dev_dir);
    let (status, _) = get(ready.redirect, "/seed7").await;
    assert_eq!(status, 302, "the pipeline of a normal user's run");
    let pids = processes_of(&ready.pids, &dev_dir);
    stop(
        run,
        &pids,
        &dev_dir,
        &["redirector: 1 clicks sent, 0 dropped"],
    )
    .await;
}
