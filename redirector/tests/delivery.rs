//! Delivery that cannot stall, with the real binaries.
//!
//! A collector that forgot a sender: `click_senders` emptied, or put back to an older copy
//! (what a restore from a backup, a failover to an asynchronously replicated standby or an
//! operator's cleanup does), and the collector restarted while the redirector runs on. The
//! redirector resyncs: every later redirect is written, the gap is counted as unaccounted,
//! nothing is written twice and nothing is dropped.
//!
//! A peer that never reads the collector's answers holds up nobody else's.

use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

use nix::sys::signal::Signal;
use testkit::db::await_rows_settled;
use testkit::redirector::{fixture, load::Load, metric, Fixture};
use testkit::redirector::{redirector, rows, scalar, Redirector, LIMIT};
use testkit::services::Collector;
use testkit::{eventually, Service};

/// `n` redirects from one connection (so no two clicks share a microsecond), all of them
/// acknowledged by the collector (whose admin listener is `collector`), each written once.
async fn acknowledged(f: &Fixture, r: &Redirector, collector: SocketAddr, before: u64, n: u64) {
    let load = Load {
        connections: 1,
        ..Load::get(r.http, "/resync")
    };
    assert_eq!(load.run(n).await.count(302), n);
    let admins = [r.admin, collector];
    await_rows_settled(&f.client, Some("resync"), before + n, &admins).await;
    eventually("every click acknowledged", LIMIT, || async {
        let acked = r.metric("redirector_clicks_acked_total").await;
        (acked == (before + n) as f64).then_some(())
    })
    .await;
}

/// A fixture with the link `resync`, its collector (and its admin listener), and a redirector
/// ready in front of it.
async fn running() -> (Fixture, Service, SocketAddr, Redirector) {
    let f = fixture(&[("resync", "https://example.com/")]).await;
    let (collector, admin) = start_collector(&f).await;
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;
    (f, collector, admin, r)
}

/// The collector, once ready (its socket bound).
async fn start_collector(f: &Fixture) -> (Service, std::net::SocketAddr) {
    let c = Collector::start(&f.db.url, &f.socket, &[]).await;
    (c.service, c.admin)
}

async fn stop(mut collector: Service) {
    collector.signal(Signal::SIGTERM);
    assert!(collector.wait_exit(LIMIT).await.success());
}

/// Restarts the collector with click_senders set by `forget`, then 1,000 more redirects: all
/// written once, nothing dropped, one resync. Returns the clicks counted as unaccounted.
async fn forget_and_resume(f: &Fixture, r: &Redirector, collector: Service, forget: &str) -> f64 {
    let before = rows(&f.client, None).await as u64;
    stop(collector).await;
    f.client.batch_execute(forget).await.unwrap();
    let (collector, admin) = start_collector(f).await;
    acknowledged(f, r, admin, before, 1_000).await;

    let written = rows(&f.client, None).await;
    let distinct: i64 = scalar(
        &f.client,
        "SELECT count(DISTINCT (code, clicked_at)) FROM clicks",
    )
    .await;
    assert_eq!(
        written as i64, distinct,
        "no (code, clicked_at) row written twice"
    );
    let served = r.metric("redirector_redirects_total").await;
    assert_eq!(written as f64, served, "every redirect is a row");
    assert_eq!(r.dropped().await, 0.0);
    assert!(r.metric("redirector_resyncs_total").await >= 1.0);
    assert_eq!(r.metric("redirector_acks_rejected_total").await, 0.0);
    let skipped = "collector_resyncs_total{outcome=\"skipped\"}";
    assert_eq!(metric(admin, skipped).await, 1.0);
    let gap = metric(admin, "collector_clicks_unaccounted_total").await;
    stop(collector).await;
    gap
}

#[tokio::test]
async fn a_collector_whose_click_senders_was_emptied_resumes_and_counts_the_gap() {
    let (f, collector, admin, r) = running().await;
    acknowledged(&f, &r, admin, 0, 1_000).await;

    let gap = forget_and_resume(&f, &r, collector, "DELETE FROM click_senders").await;
    assert_eq!(
        gap, 1_000.0,
        "the clicks before the resync, all unaccounted for"
    );
}

#[tokio::test]
async fn a_collector_given_back_an_older_click_senders_counts_only_what_it_lacks() {
    let (f, collector, admin, r) = running().await;
    acknowledged(&f, &r, admin, 0, 1_000).await;
    f.client
        .batch_execute("CREATE TABLE senders_copy AS SELECT * FROM click_senders")
        .await
        .unwrap();
    acknowledged(&f, &r, admin, 1_000, 1_000).await;

    let restore = "DELETE FROM click_senders; \
                   INSERT INTO click_senders SELECT * FROM senders_copy";
    let gap = forget_and_resume(&f, &r, collector, restore).await;
    assert_eq!(gap, 1_000.0, "the clicks committed after the copy");
}

/// A `click_senders` row from before migration 12 counts its sender's clicks from 0 there:
/// the resync of it, after the record lost its last datagram, claims more clicks than one
/// datagram can hold. Counted as what it can hold, and the sender goes on; refused, the
/// sender was asked again and refused again, and held for good.
#[tokio::test]
async fn a_record_whose_click_count_began_at_0_takes_its_senders_resync() {
    let (f, collector, admin, r) = running().await;
    let one_datagram = (protocol::wire::MAX_DATAGRAM / protocol::wire::MIN_CLICK_LEN) as u64;
    acknowledged(&f, &r, admin, 0, one_datagram + 1_000).await;

    let legacy = "UPDATE click_senders SET last_seq = last_seq - 1, clicks = 0";
    let gap = forget_and_resume(&f, &r, collector, legacy).await;
    assert_eq!(
        gap, one_datagram as f64,
        "what the one skipped datagram can hold"
    );
}

/// Binds `path` in a network namespace of its own whose `net.unix.max_dgram_qlen` is 512
/// (what a booted systemd host sets; a socket takes the length of the namespace it was made
/// in), and sends `datagrams` datagrams to `collector` from there, each with a fresh sender id
/// and seq 5: each one asks the collector for an answer (a resend request), which it never
/// reads. Needs root (CI runs as root), as `unshare -n` does.
fn silent_peer(path: &Path, collector: &Path, datagrams: u64) -> UnixDatagram {
    let (path, collector) = (path.to_owned(), collector.to_owned());
    // unshare(CLONE_NEWNET) moves the calling thread only: a thread of its own.
    let peer = std::thread::spawn(move || {
        let moved = unsafe { nix::libc::unshare(nix::libc::CLONE_NEWNET) };
        assert_eq!(moved, 0, "unshare -n: {}", std::io::Error::last_os_error());
        let qlen = "/proc/sys/net/unix/max_dgram_qlen";
        std::fs::write(qlen, "512").expect("setting the namespace's max_dgram_qlen");
        assert_eq!(std::fs::read_to_string(qlen).unwrap().trim(), "512");
        let socket = UnixDatagram::bind(&path).unwrap();
        let now = protocol::now_us();
        for i in 0..datagrams {
            let datagram = protocol::wire::Datagram {
                version: protocol::wire::VERSION,
                sender: 1_000_000 + i,
                seq: 5,
                base_us: now,
                clicks: vec![protocol::wire::Click::new("silent", 0)],
            };
            socket.send_to(&datagram.encode(), &collector).unwrap();
        }
        socket
    });
    peer.join().expect("the silent peer")
}

#[tokio::test]
async fn a_peer_that_never_reads_holds_up_no_other_senders_acknowledgements() {
    let f = fixture(&[("resync", "https://example.com/")]).await;
    let (collector, admin) = start_collector(&f).await;
    let silent_path = f.socket.with_file_name("silent.sock");
    let _silent = silent_peer(&silent_path, &f.socket, 3_000);
    eventually("the silent peer's answers to pile up", LIMIT, || async {
        let asked = metric(admin, "collector_resend_requests_total").await;
        let failed = metric(admin, "collector_acks_failed_total").await;
        (asked + failed >= 3_000.0 && failed > 0.0).then_some(())
    })
    .await;

    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;
    for round in 0..3 {
        acknowledged(&f, &r, admin, round * 1_000, 1_000).await;
    }
    assert_eq!(rows(&f.client, Some("resync")).await, 3_000);
    assert_eq!(r.dropped().await, 0.0);
    stop(collector).await;
}

/// Sends the collector one click of `code` dated `at_us`, as datagram `seq` of `sender`, from
/// `socket` (unbound: a sender that expects no acknowledgement).
fn send_click_from(
    socket: &UnixDatagram,
    collector: &Path,
    (sender, seq): (u64, u64),
    code: &str,
    at_us: i64,
) {
    let datagram = protocol::wire::Datagram {
        version: protocol::wire::VERSION,
        sender,
        seq,
        base_us: at_us,
        clicks: vec![protocol::wire::Click::new(code, 0)],
    };
    socket
        .send_to(&datagram.encode(), collector)
        .expect("sending to the collector");
}

/// As `send_click_from`, seq 0, from an unbound socket.
fn send_click(collector: &Path, sender: u64, code: &str, at_us: i64) {
    let socket = UnixDatagram::unbound().expect("a datagram socket");
    send_click_from(&socket, collector, (sender, 0), code, at_us);
}

/// After a collector restart, the first process to send a redirector's sender id no longer
/// takes it (and with it the redirector's acknowledgements, for good): the collector knows
/// from click_senders where that sender's acknowledgements go. A forger sending the id's next
/// seq, from no address and from one of its own beside the redirector's, is refused, and the
/// redirector's clicks after the restart are written and acknowledged.
#[tokio::test]
async fn after_a_collector_restart_another_process_cannot_take_a_redirectors_sender_id() {
    let (f, collector, admin, r) = running().await;
    acknowledged(&f, &r, admin, 0, 1_000).await;
    let sender: i64 = scalar(&f.client, "SELECT sender FROM click_senders").await;
    let last: i64 = scalar(&f.client, "SELECT last_seq FROM click_senders").await;
    let recorded = "SELECT reply_uid FROM click_senders WHERE reply_to IS NOT NULL";
    let uid: i64 = scalar(&f.client, recorded).await;
    assert_eq!(
        uid,
        i64::from(nix::unistd::getuid().as_raw()),
        "its address and user"
    );
    stop(collector).await;

    let (collector, admin) = start_collector(&f).await;
    let next = (sender as u64, last as u64 + 1);
    let at = protocol::now_us();
    let unbound = UnixDatagram::unbound().unwrap();
    let bound = UnixDatagram::bind(f.socket.with_file_name("forger.sock")).unwrap();
    for socket in [&unbound, &bound] {
        send_click_from(socket, &f.socket, next, "forged", at);
    }
    let mismatch = "collector_datagrams_rejected_total{reason=\"sender_mismatch\"}";
    eventually("both forgeries refused", LIMIT, || async {
        (metric(admin, mismatch).await == 2.0).then_some(())
    })
    .await;
    acknowledged(&f, &r, admin, 1_000, 1_000).await;
    assert_eq!(rows(&f.client, Some("forged")).await, 0);
    assert_eq!(r.dropped().await, 0.0);
    stop(collector).await;
}

/// A datagram the collector wrote, sent to it again (its sender and seq again, as a sender
/// that missed the acknowledgement resends it), is a duplicate: not written again, even a
/// moment later. The count is already there when the copy is sent, so only a wait until the
/// pipeline settled can tell.
#[tokio::test]
async fn a_datagram_sent_again_after_it_was_written_is_not_written_again() {
    let f = fixture(&[]).await;
    let (collector, admin) = start_collector(&f).await;
    let at = protocol::now_us();
    send_click(&f.socket, 1, "again", at);
    await_rows_settled(&f.client, Some("again"), 1, &[admin]).await;
    send_click(&f.socket, 1, "again", at);
    await_rows_settled(&f.client, Some("again"), 1, &[admin]).await;
    assert_eq!(
        metric(admin, "collector_datagrams_duplicate_total").await,
        1.0
    );
    stop(collector).await;
}

/// What the settled wait is for: a copy of a click that reaches `clicks` only after the count
/// was reached (here the same click again under another sender id, already queued on the
/// collector's socket when the wait begins) is waited for, and fails the wait.
#[tokio::test]
async fn a_click_written_again_after_the_count_was_reached_fails_the_settled_wait() {
    let f = fixture(&[]).await;
    let (collector, admin) = start_collector(&f).await;
    let at = protocol::now_us();
    send_click(&f.socket, 1, "twice", at);
    await_rows_settled(&f.client, Some("twice"), 1, &[admin]).await;

    send_click(&f.socket, 2, "twice", at);
    let client = testkit::pgtest::connect(&f.db.url).await;
    let wait = tokio::spawn(async move {
        await_rows_settled(&client, Some("twice"), 1, &[admin]).await;
    });
    let failed = wait
        .await
        .expect_err("the copy must fail the settled wait")
        .into_panic();
    let why = failed
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| failed.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    // Found once the pipeline settled or, on a slow machine, by the count itself.
    assert!(
        why.contains("a click written twice")
            || why.contains("more rows in clicks than clicks sent"),
        "{why}"
    );
    assert_eq!(rows(&f.client, Some("twice")).await, 2);
    stop(collector).await;
}
