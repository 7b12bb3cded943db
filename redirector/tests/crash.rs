//! A redirector killed with SIGKILL loses nothing (issue 27), with the real binaries: the ring
//! and the resend window live in the state region (a `--state-file`, or a memfd in systemd's
//! file descriptor store), and the next process sends what they hold.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use nix::sys::signal::Signal;
use testkit::db::await_rows_settled;
use testkit::redirector::{fixture, load::Load, redirector_command, start_redirector, Fixture};
use testkit::redirector::{rows, Redirector, LIMIT};
use testkit::services::Collector;
use testkit::{eventually, Service, XorShift};

const CODE: &str = "crash";

async fn start_collector(f: &Fixture) -> (Service, SocketAddr) {
    let cmd = testkit::services::collector_command(&f.db.url, &f.socket, &[]);
    let collector = Collector::spawn(cmd).await;
    collector.ready().await;
    (collector.service, collector.admin)
}

/// The collector started, then `next`, a redirector on the state region the last one left:
/// it adopts the `n` clicks the last one served, and each is written once. Returns it, for
/// the caller's checks, with the collector stopped.
async fn all_written_by_the_next(
    f: &Fixture,
    n: u64,
    next: impl std::future::Future<Output = Redirector>,
) -> Redirector {
    let (_collector, collector_admin) = start_collector(f).await;
    let r = next.await;
    r.ready().await;
    await_rows_settled(&f.client, Some(CODE), n, &[r.admin, collector_admin]).await;
    let recovered = r.metric("redirector_clicks_recovered_total").await;
    assert_eq!(recovered, n as f64, "clicks adopted from the state region");
    let queued = r.metric("redirector_clicks_queued_total").await;
    assert_eq!(
        queued, 0.0,
        "adopted clicks are not counted as this process's pushes"
    );
    r
}

/// Asks `r` for the test's code `n` times: how many were redirected.
async fn redirected(r: &Redirector, n: u64) -> u64 {
    Load::get(r.http, &format!("/{CODE}"))
        .run(n)
        .await
        .count(302)
}

/// Every drop reason's count in the redirector's `/metrics`, those above zero.
async fn drops(r: &Redirector) -> Vec<String> {
    let (_, text) = testkit::http::get(r.admin, "/metrics").await.unwrap();
    text.lines()
        .filter(|l| l.starts_with("redirector_clicks_dropped_total{") && !l.ends_with(" 0"))
        .map(str::to_owned)
        .collect()
}

/// A redirector on a `--state-file` that served `n` clicks with no collector, then was
/// killed; with the path of its state file.
async fn killed_holding(n: u64) -> (Fixture, String) {
    let (f, state, mut r) = holding(n, &[]).await;
    r.kill().await;
    (f, state)
}

/// A redirector on a `--state-file`, given `extra` flags too, that served `n` clicks with no
/// collector; with the path of its state file.
async fn holding(n: u64, extra: &[&str]) -> (Fixture, String, Redirector) {
    let f = fixture(&[(CODE, "https://example.com/crash")]).await;
    let state = f.socket.with_file_name("redirector.state");
    let state = state.to_str().unwrap().to_owned();
    let flags = [&["--state-file", state.as_str()], extra].concat();
    let r = start_redirector(redirector_command(&f.db.url, &f.socket, &flags)).await;
    r.ready().await;
    assert_eq!(redirected(&r, n).await, n);
    assert_eq!(r.metric("redirector_clicks_queued_total").await, n as f64);
    (f, state, r)
}

/// Waits until `r`'s window holds datagrams.
async fn await_window(r: &Redirector) {
    eventually("datagrams in the window", LIMIT, || async {
        (r.metric("redirector_unacked_clicks").await > 0.0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn clicks_served_while_the_collector_is_away_outlive_a_kill_of_the_redirector() {
    const N: u64 = 5_000;
    let (f, state) = killed_holding(N).await;
    let cmd = redirector_command(&f.db.url, &f.socket, &["--state-file", &state]);
    let r = all_written_by_the_next(&f, N, start_redirector(cmd)).await;
    assert_eq!(drops(&r).await, Vec::<String>::new(), "nothing dropped");
}

/// A `--state-file` in the unit's RuntimeDirectory=, which systemd removes at every stop, is
/// warned about at start: what a stop leaves there would be lost uncounted.
#[tokio::test]
async fn a_state_file_in_the_runtime_directory_systemd_removes_is_warned_about() {
    let f = fixture(&[(CODE, "https://example.com/crash")]).await;
    let dir = f.socket.parent().unwrap();
    let state = dir.join("redirector.state");
    let mut cmd = redirector_command(
        &f.db.url,
        &f.socket,
        &["--state-file", state.to_str().unwrap()],
    );
    cmd.env("RUNTIME_DIRECTORY", dir);
    let r = start_redirector(cmd).await;
    let line = r
        .service
        .wait_for_log("RuntimeDirectoryPreserve=yes", LIMIT)
        .await;
    assert!(line.contains(&format!("is in {}", dir.display())), "{line}");
}

/// What a reboot leaves in a state file: another boot's id in its header (`boot`, at byte 72
/// of `redirector/src/state.rs`'s `Header`).
fn as_if_rebooted(state: &str) {
    let now = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let hex: String = now.trim().chars().filter(|c| *c != '-').collect();
    let other = !u128::from_str_radix(&hex, 16).unwrap();
    let words = [(other >> 64) as u64, other as u64];
    let bytes = [words[0].to_ne_bytes(), words[1].to_ne_bytes()].concat();
    let file = std::fs::OpenOptions::new().write(true).open(state).unwrap();
    nix::sys::uio::pwrite(&file, &bytes, 72).unwrap();
}

/// A state file found after a reboot that its redirector was not stopped cleanly before (here
/// killed, then given another boot's id): its pages may be of different ages, older than what
/// the collector committed, so none of it is sent; its clicks are counted as dropped
/// (`stale_region`), and what the next process serves is written, under a new sender id.
#[tokio::test]
async fn a_state_file_left_by_a_crash_before_a_reboot_is_counted_not_sent() {
    const N: u64 = 500;
    let (f, state) = killed_holding(N).await;
    as_if_rebooted(&state);

    let (_collector, collector_admin) = start_collector(&f).await;
    let flags = ["--state-file", &state];
    let r = start_redirector(redirector_command(&f.db.url, &f.socket, &flags)).await;
    r.ready().await;
    assert_eq!(redirected(&r, N).await, N);
    await_rows_settled(&f.client, Some(CODE), N, &[r.admin, collector_admin]).await;
    let stale = format!("redirector_clicks_dropped_total{{reason=\"stale_region\"}} {N}");
    assert_eq!(drops(&r).await, [stale]);
    assert_eq!(r.metric("redirector_clicks_recovered_total").await, 0.0);
}

/// A state file holding `n` clicks in its window, copied; then the sender goes on from it,
/// and what it held and `n` more are written. With the state file's path, the copy's, the
/// collector and its admin address.
async fn gone_on_from_a_copy(n: u64) -> (Fixture, String, String, Service, SocketAddr) {
    let (f, state, mut r) = holding(n, &[]).await;
    let flags = ["--state-file", &state];
    await_window(&r).await;
    r.kill().await;
    let copy = format!("{state}.copy");
    std::fs::copy(&state, &copy).unwrap();
    let (collector, collector_admin) = start_collector(&f).await;
    let mut r = start_redirector(redirector_command(&f.db.url, &f.socket, &flags)).await;
    r.ready().await;
    assert_eq!(redirected(&r, n).await, n);
    await_rows_settled(&f.client, Some(CODE), 2 * n, &[r.admin, collector_admin]).await;
    r.kill().await;
    (f, state, copy, collector, collector_admin)
}

/// A state file restored from an older copy (a backup, a snapshot) after its sender went on:
/// the collector committed seqs of that sender the copy never held, and says so in its
/// acknowledgement of the datagrams the copy holds: past them. Nothing new is sent until an
/// acknowledgement of the whole adopted window or a resend request, so no new seq can hide
/// that. What the copy held is counted as `stale_region` (here it was written: "may have
/// been"), not sent again, and the clicks served since the start land under a new sender id.
/// Before, the collector took the new datagrams up to its record for ones it
/// had committed, and the redirector freed those clicks unwritten, uncounted.
#[tokio::test]
async fn a_state_file_rolled_back_behind_the_collector_loses_no_click_uncounted() {
    const N: u64 = 500;
    let (f, state, copy, _collector, collector_admin) = gone_on_from_a_copy(N).await;
    let flags = ["--state-file", &state];
    std::fs::copy(&copy, &state).unwrap();
    let r = start_redirector(redirector_command(&f.db.url, &f.socket, &flags)).await;
    r.ready().await;
    assert_eq!(redirected(&r, N).await, N);
    await_rows_settled(&f.client, Some(CODE), 3 * N, &[r.admin, collector_admin]).await;
    let stale = format!("redirector_clicks_dropped_total{{reason=\"stale_region\"}} {N}");
    assert_eq!(drops(&r).await, [stale]);
    r.service
        .wait_for_log("went further than its region says", LIMIT)
        .await;
}

/// The same, with the redirector restarted before any collector answered the start that
/// adopted the copy: the clicks that start served wait in the ring (nothing new is sealed
/// until the collector confirms the adopted window), and the next start, which the collector
/// refuses, drops only what the copy held. Before, the adoption's tail was the next start's
/// own, and the clicks served meanwhile were dropped as the copy's.
#[tokio::test]
async fn clicks_served_before_a_rolled_back_region_is_refused_outlive_a_restart() {
    const N: u64 = 500;
    let (f, state, copy, collector, _) = gone_on_from_a_copy(N).await;
    let flags = ["--state-file", &state];
    drop(collector);

    std::fs::copy(&copy, &state).unwrap();
    let mut r = start_redirector(redirector_command(&f.db.url, &f.socket, &flags)).await;
    r.ready().await;
    assert_eq!(redirected(&r, N).await, N);
    r.kill().await;
    let (_collector, collector_admin) = start_collector(&f).await;
    let r = start_redirector(redirector_command(&f.db.url, &f.socket, &flags)).await;
    r.ready().await;
    r.service
        .wait_for_log("went further than its region says", LIMIT)
        .await;
    await_rows_settled(&f.client, Some(CODE), 3 * N, &[r.admin, collector_admin]).await;
    let stale = format!("redirector_clicks_dropped_total{{reason=\"stale_region\"}} {N}");
    assert_eq!(drops(&r).await, [stale]);
}

/// A state file whose window holds a datagram with a damaged click (a byte of its code; the
/// header intact, so the start adopts it): the collector rejects it at every resend, and
/// before, the sender resent it for good while its ring filled and dropped everything after.
/// The collector passes it over, counting its clicks as rejected once the batch that passes
/// it over commits (a collector killed before would count them, and its next process again),
/// and every other click is written, those served after the start included.
#[tokio::test]
async fn a_window_datagram_with_a_damaged_click_is_passed_over_not_resent_for_good() {
    const N: u64 = 500;
    let (f, state, mut r) = holding(N, &[]).await;
    await_window(&r).await;
    r.kill().await;
    // In a datagram a code follows its length; in a ring cell, the country's bytes.
    let mut bytes = std::fs::read(&state).unwrap();
    let encoded: Vec<u8> = [&[CODE.len() as u8], CODE.as_bytes()].concat();
    let at = bytes.windows(encoded.len()).position(|w| w == encoded);
    bytes[at.expect("a datagram in the state file") + 2] = b' ';
    std::fs::write(&state, bytes).unwrap();

    let (collector, collector_admin) = start_collector(&f).await;
    // The collector's batches wait on click_senders until this transaction ends.
    let mut holder = testkit::pgtest::connect(&f.db.url).await;
    let held = holder.transaction().await.unwrap();
    let lock = "LOCK TABLE click_senders IN EXCLUSIVE MODE";
    held.batch_execute(lock).await.unwrap();
    let cmd = redirector_command(&f.db.url, &f.socket, &["--state-file", &state]);
    let r = start_redirector(cmd).await;
    r.ready().await;
    collector.wait_for_log("passed over so that", LIMIT).await;
    let series = "collector_clicks_rejected_total";
    let before_commit = testkit::services::metric(collector_admin, series).await;
    assert_eq!(before_commit, 0.0, "counted before its batch committed");
    held.rollback().await.unwrap();
    assert_eq!(redirected(&r, N).await, N);
    let rejected = eventually("the damaged datagram passed over", LIMIT, || async {
        let rejected = testkit::services::metric(collector_admin, series).await;
        (rejected > 0.0).then_some(rejected as u64)
    })
    .await;
    assert!(
        rejected <= N,
        "{rejected} rejected: only what the file held"
    );
    let written = 2 * N - rejected;
    await_rows_settled(&f.client, Some(CODE), written, &[r.admin, collector_admin]).await;
    assert_eq!(drops(&r).await, Vec::<String>::new(), "nothing dropped");
}

/// A start that adopts datagrams in its window while its collector is stopped (alive,
/// reading nothing): the ring holds what is served and drops the rest as `ring_full`,
/// counted; once the collector reads again, its acknowledgement confirms the adopted window
/// (until then nothing new is sealed) and every click held is written: nothing stalls,
/// nothing is lost uncounted.
#[tokio::test]
async fn an_adopted_window_its_collector_does_not_answer_holds_the_ring_then_goes_on() {
    const N: u64 = 200;
    const M: u64 = 1_000;
    let (f, state, mut r) = holding(N, &["--ring-capacity", "256"]).await;
    await_window(&r).await;
    r.kill().await;
    let (collector, collector_admin) = start_collector(&f).await;
    collector.signal(Signal::SIGSTOP);
    // Without --ring-capacity: a state file is adopted with the layout it was made with.
    let cmd = redirector_command(&f.db.url, &f.socket, &["--state-file", &state]);
    let r = start_redirector(cmd).await;
    r.ready().await;
    assert_eq!(redirected(&r, M).await, M);
    let full = "redirector_clicks_dropped_total{reason=\"ring_full\"}";
    let dropped = r.metric(full).await as u64;
    assert!(dropped >= M - 256, "{dropped} dropped: the ring holds 256");
    collector.signal(Signal::SIGCONT);
    await_rows_settled(
        &f.client,
        Some(CODE),
        N + M - dropped,
        &[r.admin, collector_admin],
    )
    .await;
    assert_eq!(drops(&r).await, [format!("{full} {dropped}")]);
}

/// A redirector killed while the collector holds its datagrams unread, started again on its
/// state region with another `--ack-socket`: the collector had taken the sender id for the
/// first process's, acknowledged at its address, and refused the next process's claim from
/// elsewhere for good. Nobody listens at the old address any more, so the claim is the
/// successor's: what it resends is acknowledged, and what it serves next is written.
#[tokio::test]
async fn a_redirector_restarted_with_another_ack_socket_goes_on_under_its_id() {
    const N: u64 = 300;
    let f = fixture(&[(CODE, "https://example.com/crash")]).await;
    let state = f.socket.with_file_name("redirector.state");
    let flags = ["--state-file", state.to_str().unwrap()];
    let (collector, collector_admin) = start_collector(&f).await;
    let mut r = start_redirector(redirector_command(&f.db.url, &f.socket, &flags)).await;
    r.ready().await;
    assert_eq!(redirected(&r, N).await, N);
    await_rows_settled(&f.client, Some(CODE), N, &[r.admin, collector_admin]).await;
    collector.signal(Signal::SIGSTOP);
    assert_eq!(redirected(&r, N).await, N);
    eventually(
        "the clicks sent to the stopped collector",
        LIMIT,
        || async {
            let sent = r.metric("redirector_clicks_sent_total").await;
            (sent == 2.0 * N as f64).then_some(())
        },
    )
    .await;
    r.kill().await;
    // redirector_command gives each process an --ack-socket of its own.
    let r = start_redirector(redirector_command(&f.db.url, &f.socket, &flags)).await;
    r.ready().await;
    collector.signal(Signal::SIGCONT);
    assert_eq!(redirected(&r, N).await, N);
    await_rows_settled(&f.client, Some(CODE), 3 * N, &[r.admin, collector_admin]).await;
    assert_eq!(
        r.metric("redirector_clicks_recovered_total").await,
        N as f64
    );
}

#[tokio::test]
async fn what_a_stop_leaves_in_a_state_file_is_kept_for_the_next_start_not_dropped() {
    const N: u64 = 1_000;
    let f = fixture(&[(CODE, "https://example.com/crash")]).await;
    let state = f.socket.with_file_name("redirector.state");
    let state = state.to_str().unwrap();
    let flags = ["--state-file", state, "--drain-timeout", "200ms"];
    let mut r = start_redirector(redirector_command(&f.db.url, &f.socket, &flags)).await;
    r.ready().await;
    let served = Load::get(r.http, &format!("/{CODE}")).run(N).await;
    assert_eq!(served.count(302), N, "{served:?}");
    r.service.signal(Signal::SIGTERM);
    assert!(r.service.wait_exit(LIMIT).await.success());
    let log = r.service.log();
    assert_eq!(
        testkit::redirector::final_counts(&log).1,
        0,
        "nothing dropped"
    );
    let last = log
        .iter()
        .rev()
        .find(|l| l.contains("kept for the next start"));
    assert!(
        last.is_some_and(|l| l.contains(&format!("{N} kept for the next start"))),
        "{last:?}"
    );

    let cmd = redirector_command(&f.db.url, &f.socket, &flags);
    all_written_by_the_next(&f, N, start_redirector(cmd)).await;
}

#[tokio::test]
async fn a_second_redirector_on_the_same_state_file_refuses_to_start() {
    let f = fixture(&[(CODE, "https://example.com/crash")]).await;
    let state = f.socket.with_file_name("redirector.state");
    let flags = ["--state-file", state.to_str().unwrap()];
    let first = start_redirector(redirector_command(&f.db.url, &f.socket, &flags)).await;
    first.ready().await;
    let cmd = redirector_command(&f.db.url, &f.socket, &flags);
    let mut second = Service::spawn("second redirector", cmd);
    let status = second.wait_exit(LIMIT).await;
    assert!(!status.success(), "{status}");
    let log = second.log().join("\n");
    assert!(
        log.contains("is in use by another redirector (it is locked)"),
        "{log}"
    );
    assert_eq!(
        testkit::http::get(first.admin, "/healthz").await.unwrap().0,
        200
    );
}

/// A datagram size no encoder takes is refused before the state region is laid out with it:
/// laid out, the region would be refused by every later start, whatever its flags.
#[tokio::test]
async fn a_datagram_size_out_of_range_is_refused_and_leaves_the_state_file_as_it_was() {
    let f = fixture(&[(CODE, "https://example.com/crash")]).await;
    let state = f.socket.with_file_name("redirector.state");
    let flags = ["--state-file", state.to_str().unwrap()];
    let mut first = start_redirector(redirector_command(&f.db.url, &f.socket, &flags)).await;
    first.ready().await;
    first.service.signal(Signal::SIGTERM);
    assert!(first.service.wait_exit(LIMIT).await.success());

    let size = (protocol::wire::MIN_DATAGRAM - 1).to_string();
    let bad = [&flags[..], &["--datagram-size", &size]].concat();
    let mut refused = Service::spawn("redirector", redirector_command(&f.db.url, &f.socket, &bad));
    assert!(!refused.wait_exit(LIMIT).await.success());
    let log = refused.log().join("\n");
    assert!(log.contains("--datagram-size"), "{log}");

    let next = start_redirector(redirector_command(&f.db.url, &f.socket, &flags)).await;
    next.ready().await;
}

/// Where the test holds the redirector's listeners, as systemd's socket units do.
struct Held {
    http: TcpListener,
    admin: TcpListener,
}

impl Held {
    fn bind() -> Held {
        let bind = || TcpListener::bind("127.0.0.1:0").unwrap();
        Held {
            http: bind(),
            admin: bind(),
        }
    }

    /// `cmd` on the held listeners, and on `state` if given (the fd store's copy).
    async fn start(&self, cmd: std::process::Command, state: Option<&OwnedFd>) -> Redirector {
        let mut named = vec![
            ("http", self.http.as_raw_fd()),
            ("admin", self.admin.as_raw_fd()),
        ];
        named.extend(state.map(|fd| ("state", fd.as_raw_fd())));
        start_redirector(testkit::socket_activated_named(&cmd, &named)).await
    }
}

#[tokio::test]
async fn under_load_three_kills_lose_no_redirect_a_client_saw_and_write_none_twice() {
    let f = fixture(&[(CODE, "https://example.com/crash")]).await;
    let state = f.socket.with_file_name("redirector.state");
    // One acknowledgement socket for every start, as the unit's is: the collector hands the
    // sender id to a later process of the same user at the same address.
    let ack = f.socket.with_file_name("redirector-ack.sock");
    let flags = [
        "--state-file",
        state.to_str().unwrap(),
        "--ack-socket",
        ack.to_str().unwrap(),
    ];
    let (_collector, collector_admin) = start_collector(&f).await;
    let held = Held::bind();
    let mut r = held
        .start(redirector_command(&f.db.url, &f.socket, &flags), None)
        .await;
    r.ready().await;
    let mut moments = XorShift::from_clock("crash");
    let load = Load {
        connections: 8,
        reconnect: true,
        ..Load::get(held.http.local_addr().unwrap(), &format!("/{CODE}"))
    };
    let running = load.start();
    let (mut torn, mut recovered) = (0.0, 0.0);
    for _ in 0..3 {
        let pause = moments.pause(Duration::from_millis(300), Duration::from_millis(1_200));
        tokio::time::sleep(pause).await;
        r.kill().await;
        let unix_now = || std::time::UNIX_EPOCH.elapsed().unwrap().as_secs_f64();
        let before = unix_now();
        r = held
            .start(redirector_command(&f.db.url, &f.socket, &flags), None)
            .await;
        r.ready().await;
        // What ClicksDropped reads beside the counts made at start (monitoring/alerts.yml).
        let started = r.metric("redirector_start_time_seconds").await;
        assert!(
            (before.floor()..=unix_now()).contains(&started),
            "start time {started}, started at {before} or after"
        );
        torn += r
            .metric("redirector_clicks_dropped_total{reason=\"torn\"}")
            .await;
        recovered += r.metric("redirector_clicks_recovered_total").await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    load.stop();
    let seen = running.await.unwrap();
    let ok = seen.count(302);
    // 503: a restarted redirector before its link table is loaded (not a click).
    assert_eq!(
        seen.total(),
        ok + seen.count(503),
        "only redirects: {seen:?}"
    );
    eprintln!(
        "crash: {ok} redirects seen, {} requests cut off, {recovered} clicks recovered, {torn} \
         torn",
        seen.errors
    );
    assert!(
        ok > 0 && recovered > 0.0,
        "the kills came under load: {seen:?}"
    );
    // Settled: the last redirector has nothing in its ring or window, the collector nothing
    // uncommitted, and the count stays.
    let rows = eventually("the last clicks to be written", LIMIT, || async {
        let n = rows(&f.client, Some(CODE)).await;
        (n >= ok).then_some(n)
    })
    .await;
    await_rows_settled(&f.client, Some(CODE), rows, &[r.admin, collector_admin]).await;
    assert!(
        rows <= ok + seen.errors,
        "{rows} rows for {ok} redirects seen and {} cut off: a click written twice",
        seen.errors
    );
    let other_drops: Vec<_> = drops(&r)
        .await
        .into_iter()
        .filter(|l| !l.contains("reason=\"torn\""))
        .collect();
    assert_eq!(
        other_drops,
        Vec::<String>::new(),
        "nothing dropped but torn pushes"
    );
}

/// Plays systemd's part of the file descriptor store: the `NOTIFY_SOCKET` the redirector hands
/// its state region to (`FDSTORE=1`, `FDNAME=state`), kept to pass back at the next start.
struct FdStore {
    socket: UnixDatagram,
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl FdStore {
    fn new() -> FdStore {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket.set_nonblocking(true).unwrap();
        FdStore {
            socket,
            _dir: dir,
            path,
        }
    }

    /// The environment systemd gives a service with `FileDescriptorStoreMax=1`.
    fn env(&self, cmd: &mut std::process::Command) {
        cmd.env("NOTIFY_SOCKET", &self.path).env("FDSTORE", "1");
    }

    /// Waits for the `FDSTORE=1` message and takes its descriptor (`READY=1` and the like are
    /// read past).
    async fn stored(&self) -> OwnedFd {
        eventually("FDSTORE=1 with a descriptor", LIMIT, || async {
            self.receive()
        })
        .await
    }

    fn receive(&self) -> Option<OwnedFd> {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        use std::os::fd::FromRawFd;
        loop {
            let mut buf = [0u8; 256];
            let mut iov = [std::io::IoSliceMut::new(&mut buf)];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
            let fd = self.socket.as_raw_fd();
            let msg = recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::empty()).ok()?;
            let fds: Vec<OwnedFd> = msg
                .cmsgs()
                .ok()?
                .filter_map(|c| match c {
                    ControlMessageOwned::ScmRights(fds) => Some(fds),
                    _ => None,
                })
                .flatten()
                // SAFETY: SCM_RIGHTS gave these descriptors to this process.
                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
                .collect();
            let text = String::from_utf8_lossy(msg.iovs().next().unwrap_or_default()).into_owned();
            if text.contains("FDSTORE=1") {
                assert!(text.contains("FDNAME=state"), "{text:?}");
                assert_eq!(fds.len(), 1, "one descriptor with {text:?}");
                return fds.into_iter().next();
            }
        }
    }
}

async fn start_with_store(
    f: &Fixture,
    held: &Held,
    store: &FdStore,
    state: Option<&OwnedFd>,
    flags: &[&str],
) -> Redirector {
    let mut cmd = redirector_command(&f.db.url, &f.socket, flags);
    store.env(&mut cmd);
    held.start(cmd, state).await
}

/// A redirector under a store of the test's, with no collector, killed after `n` redirects:
/// the region the store kept holds their clicks.
async fn killed_under_a_store(n: u64) -> (Fixture, Held, FdStore, OwnedFd) {
    let f = fixture(&[(CODE, "https://example.com/crash")]).await;
    let held = Held::bind();
    let store = FdStore::new();
    let mut r = start_with_store(&f, &held, &store, None, &[]).await;
    let memfd = store.stored().await;
    r.ready().await;
    assert_eq!(redirected(&r, n).await, n);
    r.kill().await;
    (f, held, store, memfd)
}

#[tokio::test]
async fn the_state_region_kept_in_the_fd_store_comes_back_after_a_kill() {
    const N: u64 = 2_000;
    let (f, held, store, memfd) = killed_under_a_store(N).await;

    let next = start_with_store(&f, &held, &store, Some(&memfd), &[]);
    let r = all_written_by_the_next(&f, N, next).await;
    assert!(
        store.receive().is_none(),
        "a region passed back is not stored again"
    );
    assert_eq!(drops(&r).await, Vec::<String>::new(), "nothing dropped");
}

/// A start that does not use the region systemd kept (`--state-file` set, or clicks not sent
/// by the pipeline) says how many clicks it holds, and leaves them there: the next start that
/// uses it sends them.
#[tokio::test]
async fn a_start_that_does_not_use_the_kept_region_says_what_it_holds_and_leaves_it() {
    const N: u64 = 500;
    let (f, held, store, memfd) = killed_under_a_store(N).await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state");
    let file = file.to_str().unwrap();
    for flags in [["--state-file", file], ["--clicks", "off"]] {
        let mut r = start_with_store(&f, &held, &store, Some(&memfd), &flags).await;
        let said = "the state region systemd kept holds";
        let line = r.service.wait_for_log(said, LIMIT).await;
        assert!(
            line.contains(&format!("holds {N} clicks")),
            "{flags:?}: {line}"
        );
        r.kill().await;
    }
    let next = start_with_store(&f, &held, &store, Some(&memfd), &[]);
    all_written_by_the_next(&f, N, next).await;
}

/// A stop under systemd's store counts what it leaves as dropped (whether the store keeps the
/// region over a stop is not the process's to see). When the store does keep it, the next
/// start sends those clicks after all and reports them as reclaimed, so that dropped minus
/// reclaimed is what was lost: here nothing.
#[tokio::test]
async fn what_a_stop_under_the_fd_store_counted_as_dropped_is_reclaimed_by_the_next_start() {
    const N: u64 = 1_000;
    let f = fixture(&[(CODE, "https://example.com/crash")]).await;
    let held = Held::bind();
    let store = FdStore::new();
    let flags = ["--drain-timeout", "200ms"];
    let mut r = start_with_store(&f, &held, &store, None, &flags).await;
    let memfd = store.stored().await;
    r.ready().await;
    assert_eq!(redirected(&r, N).await, N);
    r.service.signal(Signal::SIGTERM);
    assert!(r.service.wait_exit(LIMIT).await.success());
    let log = r.service.log();
    assert_eq!(
        testkit::redirector::final_counts(&log),
        (0, N),
        "nothing sent, all counted as dropped"
    );

    let next = start_with_store(&f, &held, &store, Some(&memfd), &[]);
    let mut r = all_written_by_the_next(&f, N, next).await;
    assert_eq!(
        r.metric("redirector_clicks_reclaimed_total").await,
        N as f64,
        "what the stop counted as dropped, sent after all"
    );
    assert_eq!(drops(&r).await, Vec::<String>::new(), "nothing dropped");

    // Reported once: this start cleared the stop's record once it had counted it, so a kill
    // of it, holding clicks of its own, leaves the next start none to report as reclaimed.
    assert_eq!(redirected(&r, N).await, N);
    r.kill().await;
    let r = start_with_store(&f, &held, &store, Some(&memfd), &[]).await;
    r.ready().await;
    assert_eq!(
        r.metric("redirector_clicks_recovered_total").await,
        N as f64
    );
    assert_eq!(
        r.metric("redirector_clicks_reclaimed_total").await,
        0.0,
        "the last stop's drops, reported by the start before"
    );
}

/// A start that fails on its configuration (here a `--socket` path too long for a Unix
/// address) fails before it adopts the state region, and leaves it as the clean stop left it:
/// adopted, its mark of a clean stop was cleared (a reboot before the next start would then
/// throw its clicks away as stale) and its counts of torn and stale clicks went to a process
/// nobody scraped.
#[tokio::test]
async fn a_start_that_fails_on_its_flags_leaves_the_state_file_as_it_was() {
    const N: u64 = 300;
    let (f, state, mut r) = holding(N, &[]).await;
    r.service.signal(Signal::SIGTERM);
    assert!(r.service.wait_exit(LIMIT).await.success());
    let before = std::fs::read(&state).unwrap();
    let long = f.socket.with_file_name("s".repeat(120));
    let cmd = redirector_command(&f.db.url, &long, &["--state-file", &state]);
    let mut failed = Service::spawn("redirector", cmd);
    assert_eq!(failed.wait_exit(LIMIT).await.code(), Some(1));
    let log = failed.log();
    assert!(log.iter().any(|l| l.contains("--socket")), "{log:?}");
    assert!(
        std::fs::read(&state).unwrap() == before,
        "the state file changed"
    );
}

/// From the moment a stop closes the listener, `/healthz` says 503 `stopping` while the drain
/// runs out its time (here with no collector): a load balancer or a readiness probe asking it
/// otherwise sent clients to a closed port for up to twice `--drain-timeout`.
#[tokio::test]
async fn healthz_says_stopping_while_the_stop_drains() {
    let (_f, _state, mut r) = holding(10, &["--drain-timeout", "3s"]).await;
    assert_eq!(
        testkit::http::get(r.admin, "/healthz").await.unwrap().0,
        200
    );
    r.service.signal(Signal::SIGTERM);
    eventually("/healthz to say stopping", LIMIT, || async {
        let (status, body) = testkit::http::get(r.admin, "/healthz").await.ok()?;
        (status == 503 && body.contains("stopping")).then_some(())
    })
    .await;
    assert!(r.service.wait_exit(LIMIT).await.success());
}
