//! The drain task against a plain datagram socket standing in for the collector: every click
//! arrives once, in numbered datagrams, across a full queue, an absent receiver and a receiver
//! that shuts down and comes back; what cannot be sent by the shutdown deadline is counted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use redirector::drain::Drain;
use redirector::metrics::Metrics;
use redirector::ring::Ring;
use shared::testkit::eventually;
use tokio::net::UnixDatagram;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(20);

struct Rig {
    _dir: tempfile::TempDir,
    path: PathBuf,
    ring: Arc<Ring>,
    metrics: Arc<Metrics>,
    stop: watch::Sender<Option<Instant>>,
    drain: JoinHandle<u64>,
}

fn rig(capacity: usize) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("collector.sock");
    let ring = Arc::new(Ring::new(capacity));
    let metrics = Arc::new(Metrics::default());
    let drain = Drain::new(
        ring.clone(),
        metrics.clone(),
        path.clone(),
        42,
        shared::wire::DEFAULT_DATAGRAM,
    )
    .unwrap();
    let (stop, stopped) = watch::channel(None);
    let drain = tokio::spawn(drain.run(Duration::from_millis(5), stopped));
    Rig {
        _dir: dir,
        path,
        ring,
        metrics,
        stop,
        drain,
    }
}

impl Rig {
    fn push(&self, code: &str, n: usize) {
        for i in 0..n {
            self.ring
                .push(code, 1_700_000_000_000_000 + i as i64)
                .unwrap();
        }
    }

    fn errors(&self, kind: &str) -> u64 {
        self.metrics.send_errors.get(kind)
    }

    /// Waits until the drain has counted a send error of `kind`.
    async fn await_error(&self, kind: &str) {
        eventually(&format!("a {kind} send error"), LIMIT, || async {
            (self.errors(kind) > 0).then_some(())
        })
        .await;
    }

    /// Stops the drain with `grace` to send what is left; returns the clicks left unsent.
    async fn stop(self, grace: Duration) -> u64 {
        self.stop.send(Some(Instant::now() + grace)).unwrap();
        tokio::time::timeout(grace + LIMIT, self.drain)
            .await
            .expect("the drain stops by its deadline")
            .unwrap()
    }
}

fn bind(path: &Path) -> UnixDatagram {
    let std = shared::socket::bind_datagram(path, 0o600).unwrap();
    std.set_nonblocking(true).unwrap();
    UnixDatagram::from_std(std).unwrap()
}

/// A rig whose receiver has not read yet, with `clicks` pushed: far more than the receive queue
/// holds (10 datagrams by default), so the drain has met a full queue when this returns.
async fn full_queue(code: &str, clicks: usize) -> (Rig, UnixDatagram) {
    let rig = rig(clicks);
    let receiver = bind(&rig.path);
    rig.push(code, clicks);
    rig.await_error("queue_full").await;
    (rig, receiver)
}

/// What a receiver saw: (seq, clicks) per datagram, every one decoded and checked.
#[derive(Default)]
struct Received {
    datagrams: Vec<(u64, usize)>,
    clicks: usize,
}

impl Received {
    async fn until(&mut self, socket: &UnixDatagram, clicks: usize, code: &str) {
        let mut buf = vec![0u8; shared::wire::MAX_DATAGRAM];
        while self.clicks < clicks {
            let n = tokio::time::timeout(LIMIT, socket.recv(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("only {} of {clicks} clicks arrived", self.clicks))
                .unwrap();
            assert!(n <= shared::wire::DEFAULT_DATAGRAM, "datagram of {n} bytes");
            let batch = shared::wire::decode(&buf[..n]).expect("a valid datagram");
            assert_eq!(batch.sender, 42);
            assert!(batch.clicks.iter().all(|c| c.code == code));
            self.datagrams.push((batch.seq, batch.clicks.len()));
            self.clicks += batch.clicks.len();
        }
        assert_eq!(self.clicks, clicks, "no more clicks than were pushed");
    }

    /// Every datagram arrived once and in order.
    fn assert_consecutive(&self) {
        let seqs: Vec<u64> = self.datagrams.iter().map(|d| d.0).collect();
        let expected: Vec<u64> = (0..seqs.len() as u64).collect();
        assert_eq!(seqs, expected);
    }
}

/// The clicks in the datagrams waiting in `socket`'s queue, read without waiting.
fn queued_clicks(socket: &UnixDatagram) -> u64 {
    let mut buf = vec![0u8; shared::wire::MAX_DATAGRAM];
    let mut clicks = 0;
    loop {
        match socket.try_recv(&mut buf) {
            Ok(n) => clicks += shared::wire::decode(&buf[..n]).unwrap().clicks.len() as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return clicks,
            Err(e) => panic!("reading the queue: {e}"),
        }
    }
}

#[tokio::test]
async fn sends_every_click_once_in_numbered_datagrams() {
    let rig = rig(100_000);
    let receiver = bind(&rig.path);
    rig.push("abc", 20_000);
    let mut got = Received::default();
    got.until(&receiver, 20_000, "abc").await;
    got.assert_consecutive();
    assert!(
        got.datagrams.len() > 1,
        "20,000 clicks need several datagrams"
    );
    eventually("sent counters", LIMIT, || async {
        (rig.metrics.clicks_sent.get() == 20_000).then_some(())
    })
    .await;
    assert_eq!(rig.metrics.datagrams_sent.get(), got.datagrams.len() as u64);
    assert_eq!(rig.stop(Duration::from_secs(1)).await, 0);
}

#[tokio::test]
async fn holds_clicks_while_nobody_listens_then_delivers_them() {
    let rig = rig(10_000);
    rig.push("away", 1_000);
    rig.await_error("not_found").await;
    assert_eq!(rig.metrics.clicks_sent.get(), 0);
    let receiver = bind(&rig.path);
    let mut got = Received::default();
    got.until(&receiver, 1_000, "away").await;
    got.assert_consecutive();
    assert_eq!(rig.stop(Duration::from_secs(1)).await, 0);
}

#[tokio::test]
async fn waits_on_a_full_queue_without_losing_or_repeating_a_click() {
    let (rig, receiver) = full_queue("slowreader", 200_000).await;
    let mut got = Received::default();
    got.until(&receiver, 200_000, "slowreader").await;
    got.assert_consecutive();
    assert_eq!(rig.stop(Duration::from_secs(1)).await, 0);
}

#[tokio::test]
async fn reconnects_when_the_receiver_leaves_like_the_collector_and_returns() {
    let rig = rig(10_000);
    let first = bind(&rig.path);
    rig.push("again", 100);
    let mut got = Received::default();
    got.until(&first, 100, "again").await;
    // What the collector does on SIGTERM: unlink the path, stop reading.
    std::fs::remove_file(&rig.path).unwrap();
    let first = first.into_std().unwrap();
    first.shutdown(std::net::Shutdown::Read).unwrap();
    rig.push("again", 100);
    eventually("the drain to notice the receiver left", LIMIT, || async {
        (rig.errors("not_connected") > 0 && rig.errors("not_found") > 0).then_some(())
    })
    .await;
    let second = bind(&rig.path);
    got.until(&second, 200, "again").await;
    got.assert_consecutive();
    drop(first);
    assert_eq!(rig.metrics.clicks_sent.get(), 200);
    assert_eq!(rig.stop(Duration::from_secs(1)).await, 0);
}

#[tokio::test]
async fn shutdown_with_nobody_listening_reports_every_click_left() {
    let rig = rig(10_000);
    rig.push("stuck", 5_000);
    rig.await_error("not_found").await;
    assert_eq!(rig.stop(Duration::from_millis(100)).await, 5_000);
}

#[tokio::test]
async fn the_shutdown_deadline_cuts_off_a_send_waiting_on_a_full_queue_and_counts_every_click() {
    // The receiver is read only once the drain has stopped: its queue stays full till then.
    let (rig, receiver) = full_queue("unread", 100_000).await;
    let metrics = rig.metrics.clone();
    let left = rig.stop(Duration::from_millis(100)).await;
    let queued = queued_clicks(&receiver);
    assert!(left > 0, "the full queue kept clicks past the deadline");
    assert_eq!(
        metrics.clicks_sent.get(),
        queued,
        "sent = what the queue holds"
    );
    assert_eq!(queued + left, 100_000, "{queued} in the queue, {left} left");
}

#[tokio::test]
async fn shutdown_sends_what_the_ring_still_holds() {
    let rig = rig(10_000);
    let receiver = bind(&rig.path);
    rig.push("last", 3_000);
    assert_eq!(rig.stop(Duration::from_secs(5)).await, 0);
    let mut got = Received::default();
    got.until(&receiver, 3_000, "last").await;
}
