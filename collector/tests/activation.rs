//! Socket activation as systemd does it: the socket is bound by someone else, passed as fd 3
//! with LISTEN_FDS/LISTEN_PID, and outlives the collector with its queued datagrams.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;

use nix::sys::signal::Signal;
use testkit::collector::*;
use testkit::pgtest::TestDb;

/// The collector started the way systemd starts it: `fd` as fd 3, LISTEN_FDS=1 and
/// LISTEN_PID set to its own pid, NOTIFY_SOCKET at `notify`.
fn activated(db: &TestDb, fd: RawFd, dir: &Path, notify: &Path) -> Command {
    let mut inner = command(db, &dir.join("not-bound.sock"), &[]);
    inner.env("NOTIFY_SOCKET", notify);
    testkit::socket_activated(&inner, fd)
}

/// The next notification the collector sent.
fn notification(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("a notification");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_socket_is_used_and_left_to_systemd_with_its_queue() {
    let p = place().await;
    let passed = shared::socket::bind_datagram(&p.path, 0o600).unwrap();
    let notify_path = p.dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(LIMIT)).unwrap();
    let sent = clicks(9_000, 40, start_us(), 13);
    let grams = datagrams(21, &sent);
    let per = |i: usize| protocol::wire::decode(&grams[i]).unwrap().clicks.len() as u64;
    let sender = connect(&p.path);

    // Queued before any collector runs, as systemd holds them.
    sender.send(&grams[0]).unwrap();
    let mut c = Collector::spawn(activated(
        &p.db,
        passed.as_raw_fd(),
        p.dir.path(),
        &notify_path,
    ))
    .await;
    assert_eq!(notification(&notify), "READY=1");
    await_rows(&p.client, None, per(0)).await;
    assert!(c
        .service
        .log()
        .iter()
        .any(|l| l.contains("passed by systemd")));
    c.service.signal(Signal::SIGTERM);
    assert_eq!(notification(&notify), "STOPPING=1");
    assert!(c.service.wait_exit(LIMIT).await.success());

    // The socket is neither unlinked nor shut: it still queues for the next start.
    assert!(p.path.exists());
    sender.send(&grams[1]).unwrap();
    let _c = Collector::spawn(activated(
        &p.db,
        passed.as_raw_fd(),
        p.dir.path(),
        &notify_path,
    ))
    .await;
    await_rows(&p.client, None, per(0) + per(1)).await;
    assert!(!p.dir.path().join("not-bound.sock").exists());
}

/// A socket systemd passed that is no datagram socket (a unit's `ListenStream=`) is refused
/// before the database steps, which would wait on the database (away here), only to fail
/// after them at every restart.
#[tokio::test]
async fn a_passed_socket_that_takes_no_datagrams_is_refused_before_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let stream = std::os::unix::net::UnixListener::bind(dir.path().join("stream.sock")).unwrap();
    let inner = testkit::services::collector_command(
        testkit::UNREACHABLE_DB,
        &dir.path().join("not-bound.sock"),
        &[],
    );
    let mut c = testkit::Service::spawn(
        "collector",
        testkit::socket_activated(&inner, stream.as_raw_fd()),
    );
    let status = c.wait_exit(LIMIT).await;
    assert!(!status.success(), "{status}");
    let log = c.log().join("\n");
    assert!(log.contains("not a Unix datagram socket"), "{log}");
}

/// READY=1 comes once the sockets are in hand, before the database is reached: the
/// redirector's unit is ordered after this one, and a start of the collector that waited on
/// its database (away here; or a migration, or an instance lock held elsewhere) held every
/// start of the redirector behind it. /healthz still says it does not write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_for_systemd_before_the_database_is_reached() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("collector.sock");
    let passed = shared::socket::bind_datagram(&path, 0o600).unwrap();
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(LIMIT)).unwrap();
    let mut inner = testkit::services::collector_command(
        testkit::UNREACHABLE_DB,
        &dir.path().join("not-bound.sock"),
        &[],
    );
    inner.env("NOTIFY_SOCKET", &notify_path);
    let mut c = Collector::spawn(testkit::socket_activated(&inner, passed.as_raw_fd())).await;
    assert_eq!(notification(&notify), "READY=1");
    assert_eq!(c.health().await, 503, "not writing: no database");
    c.service.signal(Signal::SIGTERM);
    assert_eq!(notification(&notify), "STOPPING=1");
    assert!(c.service.wait_exit(LIMIT).await.success());
}

/// Under systemd the admin listener comes from collector-admin.socket too (named "admin"),
/// beside the datagram socket, so the service needs no Internet sockets of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_passed_by_name_is_used_beside_the_datagram_socket() {
    let p = place().await;
    let passed = shared::socket::bind_datagram(&p.path, 0o600).unwrap();
    let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin_addr = admin.local_addr().unwrap();
    let inner = command(&p.db, &p.dir.path().join("not-bound.sock"), &[]);
    let cmd = testkit::socket_activated_named(
        &inner,
        &[
            ("collector.socket", passed.as_raw_fd()),
            ("admin", admin.as_raw_fd()),
        ],
    );
    let c = Collector::spawn(cmd).await;
    drop(admin);
    assert_eq!(c.admin, admin_addr, "the passed admin listener is used");
    c.ready().await;
    let sent = clicks(100, 4, start_us(), 5);
    connect(&p.path).send(&datagrams(1, &sent)[0]).unwrap();
    await_rows(&p.client, None, 100).await;
    assert!(!p.dir.path().join("not-bound.sock").exists());
}
