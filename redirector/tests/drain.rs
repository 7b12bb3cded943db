//! The drain task against a plain datagram socket standing in for the collector, which
//! acknowledges what it is told to: every click arrives, in numbered datagrams, across a full
//! queue, an absent receiver and a receiver that shuts down and comes back; what is not
//! acknowledged is sent again; acknowledgements that claim too much, or come from anyone but
//! the collector, change nothing; what cannot be sent by the stop deadline is counted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::UnixAddr;
use protocol::wire::Ack;
use redirector::drain::Metrics;
use redirector::drain::{Drain, Left, Settings};
use redirector::metrics::Common;
use redirector::ring::Ring;
use redirector::state::Region;
use shared::socket::SendErrorKind;
use testkit::eventually;
use tokio::net::UnixDatagram;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(20);

struct Rig {
    _dir: tempfile::TempDir,
    path: PathBuf,
    ack_path: PathBuf,
    ring: Arc<Ring>,
    sender: u64,
    metrics: Arc<Metrics>,
    common: Arc<Common>,
    stop: watch::Sender<Option<Instant>>,
    drain: JoinHandle<Left>,
}

/// A drain with a ring of `capacity`, a window of `window` datagrams and `ack_timeout`.
fn rig_with(capacity: usize, window: usize, ack_timeout: Duration) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("collector.sock");
    let ack_path = dir.path().join("ack.sock");
    let state = Region::in_process(capacity as u64, window as u64).unwrap();
    let (ring, sender) = (state.ring.clone(), state.sender.id());
    let (metrics, common) = (Arc::new(Metrics::default()), Arc::new(Common::default()));
    let settings = Settings {
        collector: path.clone(),
        ack_socket: ack_path.clone(),
        // Writable by anyone: the tests show what keeps others out besides the file mode.
        ack_socket_mode: 0o666,
        flush_every: Duration::from_millis(5),
        ack_timeout,
    };
    let sockets = redirector::drain::Sockets::bind(&settings).unwrap();
    let drain = Drain::new(state, sockets, metrics.clone(), common.clone(), settings).unwrap();
    let (stop, stopped) = watch::channel(None);
    let drain = tokio::spawn(drain.run(stopped));
    Rig {
        _dir: dir,
        path,
        ack_path,
        ring,
        sender,
        metrics,
        common,
        stop,
        drain,
    }
}

/// The usual rig: room for `capacity` clicks, 512 datagrams, a timeout no test reaches.
fn rig(capacity: usize) -> Rig {
    rig_with(capacity, 512, Duration::from_secs(3600))
}

impl Rig {
    fn push(&self, code: &str, n: usize) {
        for i in 0..n {
            self.ring
                .push(code, 1_700_000_000_000_000 + i as i64, &Default::default())
                .unwrap();
        }
    }

    fn errors(&self, kind: SendErrorKind) -> u64 {
        self.metrics.send_errors.get(kind)
    }

    /// Waits until the drain has counted a send error of `kind`.
    async fn await_error(&self, kind: SendErrorKind) {
        eventually(
            &format!("a {} send error", kind.as_str()),
            LIMIT,
            || async { (self.errors(kind) > 0).then_some(()) },
        )
        .await;
    }

    /// Stops the drain with `grace` to finish; returns what it left.
    async fn stop(self, grace: Duration) -> Left {
        self.stop.send(Some(Instant::now() + grace)).unwrap();
        tokio::time::timeout(grace + LIMIT, self.drain)
            .await
            .expect("the drain stops by its deadline")
            .unwrap()
    }
}

/// A stand-in collector bound at `path`.
struct Collector {
    socket: UnixDatagram,
    /// Acknowledge each datagram as it is read.
    acks: bool,
    /// The drain's sender id.
    sender: u64,
}

fn bind(path: &Path) -> UnixDatagram {
    let std = shared::socket::bind_datagram(path, 0o600).unwrap();
    std.set_nonblocking(true).unwrap();
    UnixDatagram::from_std(std).unwrap()
}

fn collector(rig: &Rig, acks: bool) -> Collector {
    Collector {
        socket: bind(&rig.path),
        acks,
        sender: rig.sender,
    }
}

impl Collector {
    fn send(&self, ack: Ack, to: &UnixAddr) -> nix::Result<usize> {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.socket);
        nix::sys::socket::sendto(fd, &ack.encode(), to, nix::sys::socket::MsgFlags::empty())
    }
}

/// What a receiver saw: (seq, clicks) per datagram, every one decoded and checked.
#[derive(Default)]
struct Received {
    datagrams: Vec<(u64, usize)>,
    clicks: usize,
    /// The drain's own address, from the datagrams.
    from: Option<UnixAddr>,
}

impl Received {
    /// Reads until `clicks` clicks arrived (counting repeats again), acknowledging each
    /// datagram if the collector does.
    async fn until(&mut self, c: &Collector, clicks: usize, code: &str) {
        let mut buf = vec![0u8; protocol::wire::MAX_DATAGRAM];
        while self.clicks < clicks {
            let read = tokio::time::timeout(LIMIT, async {
                loop {
                    c.socket.readable().await.unwrap();
                    let fd = std::os::fd::AsFd::as_fd(&c.socket);
                    match c.socket.try_io(tokio::io::Interest::READABLE, || {
                        shared::socket::recv(fd, &mut buf)
                    }) {
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        other => return other.unwrap(),
                    }
                }
            })
            .await
            .unwrap_or_else(|_| panic!("only {} of {clicks} clicks arrived", self.clicks));
            assert!(
                read.len <= protocol::wire::DEFAULT_DATAGRAM,
                "datagram of {} bytes",
                read.len
            );
            let batch = protocol::wire::decode(&buf[..read.len]).expect("a valid datagram");
            assert_eq!(batch.sender, c.sender);
            assert!(batch.clicks.iter().all(|c| c.code == code));
            self.from = read.from;
            if c.acks {
                let from = read.from.expect("the drain sends from its own address");
                c.send(Ack::new(c.sender, Some(batch.seq), None), &from)
                    .unwrap();
            }
            self.datagrams.push((batch.seq, batch.clicks.len()));
            self.clicks += batch.clicks.len();
        }
        assert_eq!(self.clicks, clicks, "no more clicks than were pushed");
    }

    fn seqs(&self) -> Vec<u64> {
        self.datagrams.iter().map(|d| d.0).collect()
    }

    /// Every datagram arrived once and in order.
    fn assert_consecutive(&self) {
        let expected: Vec<u64> = (0..self.datagrams.len() as u64).collect();
        assert_eq!(self.seqs(), expected);
    }
}

/// The clicks in the datagrams waiting in `socket`'s queue, read without waiting.
fn queued_clicks(socket: &UnixDatagram) -> u64 {
    let mut buf = vec![0u8; protocol::wire::MAX_DATAGRAM];
    let mut clicks = 0;
    loop {
        match socket.try_recv(&mut buf) {
            Ok(n) => clicks += protocol::wire::decode(&buf[..n]).unwrap().clicks.len() as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return clicks,
            Err(e) => panic!("reading the queue: {e}"),
        }
    }
}

/// A rig whose collector has not read yet, with `clicks` pushed: far more than the receive
/// queue holds (10 datagrams by default), so the drain has met a full queue when this returns.
async fn full_queue(code: &str, clicks: usize, acks: bool) -> (Rig, Collector) {
    let rig = rig(clicks);
    let c = collector(&rig, acks);
    rig.push(code, clicks);
    rig.await_error(SendErrorKind::QueueFull).await;
    (rig, c)
}

async fn await_acked(rig: &Rig, clicks: u64) {
    eventually("the clicks acknowledged", LIMIT, || async {
        (rig.metrics.clicks_acked.get() == clicks).then_some(())
    })
    .await;
}

#[tokio::test]
async fn sends_every_click_once_in_numbered_datagrams_and_forgets_what_is_acknowledged() {
    let rig = rig(100_000);
    let c = collector(&rig, true);
    rig.push("abc", 20_000);
    let mut got = Received::default();
    got.until(&c, 20_000, "abc").await;
    got.assert_consecutive();
    assert!(
        got.datagrams.len() > 1,
        "20,000 clicks need several datagrams"
    );
    assert_eq!(got.from.unwrap().path(), Some(rig.ack_path.as_path()));
    await_acked(&rig, 20_000).await;
    assert_eq!(rig.common.clicks_sent.get(), 20_000);
    assert_eq!(rig.metrics.datagrams_sent.get(), got.datagrams.len() as u64);
    assert_eq!(rig.metrics.acks.get(), got.datagrams.len() as u64);
    assert_eq!(rig.metrics.resends.get(), 0);
    let ack_path = rig.ack_path.clone();
    assert_eq!(rig.stop(Duration::from_secs(1)).await, Left::default());
    assert!(!ack_path.exists(), "the ack socket is removed at exit");
}

#[tokio::test]
async fn holds_clicks_while_nobody_listens_then_delivers_them() {
    let rig = rig(10_000);
    rig.push("away", 1_000);
    rig.await_error(SendErrorKind::NotFound).await;
    assert_eq!(rig.common.clicks_sent.get(), 0);
    let c = collector(&rig, true);
    let mut got = Received::default();
    got.until(&c, 1_000, "away").await;
    got.assert_consecutive();
    await_acked(&rig, 1_000).await;
    assert_eq!(rig.stop(Duration::from_secs(1)).await, Left::default());
}

#[tokio::test]
async fn waits_on_a_full_queue_without_losing_or_repeating_a_click() {
    let (rig, c) = full_queue("slowreader", 200_000, true).await;
    let mut got = Received::default();
    got.until(&c, 200_000, "slowreader").await;
    got.assert_consecutive();
    await_acked(&rig, 200_000).await;
    assert_eq!(rig.stop(Duration::from_secs(1)).await, Left::default());
}

#[tokio::test]
async fn a_new_collector_gets_again_what_the_one_that_left_did_not_acknowledge() {
    let rig = rig(10_000);
    let first = collector(&rig, false);
    rig.push("again", 100);
    let mut got = Received::default();
    got.until(&first, 100, "again").await;
    // What the collector does on SIGTERM: unlink the path, stop reading. It acknowledged
    // nothing: as if it had crashed with the batch.
    std::fs::remove_file(&rig.path).unwrap();
    let first = first.socket.into_std().unwrap();
    first.shutdown(std::net::Shutdown::Read).unwrap();
    rig.push("again", 100);
    rig.await_error(SendErrorKind::NotFound).await;
    let second = collector(&rig, true);
    let mut again = Received::default();
    again.until(&second, 200, "again").await;
    again.assert_consecutive();
    drop(first);
    assert!(rig.metrics.resends.get() >= 1);
    assert_eq!(
        rig.common.clicks_sent.get(),
        200,
        "each click counts as sent once"
    );
    await_acked(&rig, 200).await;
    assert_eq!(rig.stop(Duration::from_secs(1)).await, Left::default());
}

#[tokio::test]
async fn without_an_acknowledgement_in_time_everything_unacknowledged_is_sent_again() {
    let rig = rig_with(10_000, 512, Duration::from_millis(200));
    let c = collector(&rig, false);
    rig.push("timeout", 3_000);
    let mut got = Received::default();
    got.until(&c, 6_000, "timeout").await;
    let seqs = got.seqs();
    let n = seqs.len() / 2;
    assert_eq!(seqs[..n], (0..n as u64).collect::<Vec<_>>());
    assert_eq!(seqs[..n], seqs[n..], "go-back-N from the oldest");
    assert!(rig.metrics.resends.get() >= n as u64);
    assert_eq!(rig.common.clicks_sent.get(), 3_000);
    // Acknowledged at last: nothing is left to resend.
    let last = *seqs.last().unwrap();
    c.send(Ack::new(rig.sender, Some(last), None), &got.from.unwrap())
        .unwrap();
    await_acked(&rig, 3_000).await;
    assert_eq!(rig.metrics.unacked_clicks.get(), 0);
}

/// The acknowledgement timeout counts from the send a datagram waits on, not from when the
/// last wait began: a collector away for longer than the timeout, then back, is sent what was
/// not acknowledged once, not at once a second time.
#[tokio::test]
async fn a_collector_back_after_a_long_absence_is_sent_the_unacknowledged_once() {
    const ACK_TIMEOUT: Duration = Duration::from_millis(500);
    let rig = rig_with(10_000, 512, ACK_TIMEOUT);
    let first = collector(&rig, false);
    rig.push("absent", 3_000);
    let mut got = Received::default();
    got.until(&first, 3_000, "absent").await;
    std::fs::remove_file(&rig.path).unwrap();
    drop(first);
    // The timeout goes back to the oldest datagram, and its send finds nobody.
    rig.await_error(SendErrorKind::NotFound).await;
    let held = rig.metrics.datagrams_sent.get();
    let resent = rig.metrics.resends.get();
    // The absence is what the test is about: it must outlast the timeout. Attempts to reach
    // the collector back off from 50 ms, doubling: five more span over 1.5 s, three timeouts.
    let away = rig.errors(SendErrorKind::NotFound);
    eventually(
        "five more attempts to reach the collector",
        LIMIT,
        || async { (rig.errors(SendErrorKind::NotFound) >= away + 5).then_some(()) },
    )
    .await;
    let second = collector(&rig, true);
    let mut again = Received::default();
    again.until(&second, 3_000, "absent").await;
    await_acked(&rig, 3_000).await;
    assert_eq!(
        rig.metrics.resends.get() - resent,
        held,
        "each held datagram is sent to the collector that came back once"
    );
    assert_eq!(rig.stop(Duration::from_secs(1)).await, Left::default());
}

#[tokio::test]
async fn a_resend_request_goes_back_to_the_seq_asked_for_at_once() {
    let rig = rig(10_000);
    let c = collector(&rig, false);
    rig.push("asked", 8_000);
    let mut got = Received::default();
    got.until(&c, 8_000, "asked").await;
    let sent = got.datagrams.len() as u64;
    assert!(sent >= 3);
    let from = got.from.unwrap();
    c.send(Ack::new(rig.sender, Some(0), Some(1)), &from)
        .unwrap();
    let resent_clicks: usize = got.datagrams[1..].iter().map(|d| d.1).sum();
    got.until(&c, 8_000 + resent_clicks, "asked").await;
    let again: Vec<u64> = got.seqs()[sent as usize..].to_vec();
    assert_eq!(again, (1..sent).collect::<Vec<_>>());
    assert_eq!(rig.metrics.clicks_acked.get(), got.datagrams[0].1 as u64);
}

/// A drain woken late, with an acknowledgement queued and its timeout past at once (its
/// runtime held up: a busy host, a stop signal), takes the acknowledgement and resends nothing.
#[tokio::test]
async fn an_acknowledgement_queued_as_its_timeout_passes_is_no_timeout() {
    let ack_timeout = Duration::from_millis(300);
    let rig = rig_with(100, 512, ack_timeout);
    // The collector, on a thread of its own: acknowledges the first datagram once told to.
    let socket = std::os::unix::net::UnixDatagram::bind(&rig.path).unwrap();
    let sender = rig.sender;
    let (go, told) = std::sync::mpsc::channel::<()>();
    let collector = std::thread::spawn(move || {
        let mut buf = vec![0u8; protocol::wire::MAX_DATAGRAM];
        let (n, from) = socket.recv_from(&mut buf).unwrap();
        let seq = protocol::wire::decode(&buf[..n]).unwrap().seq;
        told.recv().unwrap();
        let ack = Ack::new(sender, Some(seq), None).encode();
        socket.send_to(&ack, from.as_pathname().unwrap()).unwrap();
        // Still bound, so that a resend would be taken (and counted).
        socket
    });
    rig.push("late", 10);
    let metrics = rig.metrics.clone();
    eventually("the datagram sent", LIMIT, || async {
        (metrics.datagrams_sent.get() == 1).then_some(())
    })
    .await;
    // This test's one runtime thread, the drain's too, held up past the timeout; the
    // acknowledgement comes meanwhile.
    go.send(()).unwrap();
    std::thread::sleep(ack_timeout + Duration::from_secs(1));
    let _bound = collector.join().unwrap();
    await_acked(&rig, 10).await;
    assert_eq!(rig.metrics.resends.get(), 0);
}

#[tokio::test]
async fn a_full_window_stops_the_drain_and_the_ring_holds_the_rest() {
    let rig = rig_with(50_000, 2, Duration::from_secs(3600));
    let c = collector(&rig, false);
    rig.push("held", 10_000);
    // Were the window not full, one flush would empty the ring before the first send.
    eventually(
        "two datagrams sent and the ring holding the rest",
        LIMIT,
        || async { (!rig.ring.is_empty() && rig.metrics.datagrams_sent.get() == 2).then_some(()) },
    )
    .await;
    let mut got = Received::default();
    got.until(&c, rig.common.clicks_sent.get() as usize, "held")
        .await;
    assert_eq!(got.datagrams.len(), 2, "two datagrams in flight, no more");
    assert_eq!(rig.common.clicks_dropped.total(), 0);
    // Acknowledged: the window frees and the drain goes on.
    let c = Collector { acks: true, ..c };
    c.send(Ack::new(rig.sender, Some(1), None), &got.from.unwrap())
        .unwrap();
    got.until(&c, 10_000, "held").await;
    got.assert_consecutive();
}

#[tokio::test]
async fn acknowledgements_that_claim_too_much_or_come_from_anyone_else_change_nothing() {
    let rig = rig(10_000);
    let c = collector(&rig, false);
    rig.push("forged", 1_000);
    let mut got = Received::default();
    got.until(&c, 1_000, "forged").await;
    let from = got.from.unwrap();
    let sent = got.datagrams.len() as u64;
    let refused = |rig: &Rig, n: u64| {
        let m = rig.metrics.clone();
        async move {
            eventually("the acknowledgement refused", LIMIT, || async {
                (m.acks_rejected.get() == n).then_some(())
            })
            .await
        }
    };
    // From the collector itself: past what was sent (refused), or for another sender (a
    // previous process's, late: counted apart).
    c.send(Ack::new(rig.sender, Some(sent), None), &from)
        .unwrap();
    refused(&rig, 1).await;
    c.send(Ack::new(rig.sender + 1, Some(0), None), &from)
        .unwrap();
    let m = rig.metrics.clone();
    eventually("the other sender's counted as stale", LIMIT, || async {
        (m.acks_stale.get() == 1).then_some(())
    })
    .await;
    // From anyone else, as any other user: the uid the kernel attests gives it away.
    let forged = Ack::new(rig.sender, Some(sent - 1), None).encode();
    testkit::send_as_user(65534, &rig.ack_path, &forged).unwrap();
    refused(&rig, 2).await;
    // Also while the collector is away.
    drop(c);
    std::fs::remove_file(&rig.path).unwrap();
    rig.push("forged", 1);
    rig.await_error(SendErrorKind::NotFound).await;
    testkit::send_as_user(65534, &rig.ack_path, &forged).unwrap();
    refused(&rig, 3).await;
    assert_eq!(rig.metrics.acks.get(), 0);
    assert_eq!(rig.metrics.clicks_acked.get(), 0);
    assert_eq!(rig.metrics.unacked_clicks.get(), 1_001, "nothing forgotten");
}

#[tokio::test]
async fn shutdown_with_nobody_listening_reports_every_click_left() {
    let rig = rig(10_000);
    rig.push("stuck", 5_000);
    rig.await_error(SendErrorKind::NotFound).await;
    let left = rig.stop(Duration::from_millis(100)).await;
    assert_eq!(
        left,
        Left {
            unsent: 5_000,
            unacked: 0
        }
    );
}

#[tokio::test]
async fn the_shutdown_deadline_cuts_off_a_send_waiting_on_a_full_queue_and_counts_every_click() {
    // The receiver is read only once the drain has stopped: its queue stays full till then.
    let (rig, c) = full_queue("unread", 100_000, false).await;
    let common = rig.common.clone();
    let left = rig.stop(Duration::from_millis(100)).await;
    let queued = queued_clicks(&c.socket);
    assert!(
        left.unsent > 0,
        "the full queue kept clicks past the deadline"
    );
    assert_eq!(
        common.clicks_sent.get(),
        queued,
        "sent = what the queue holds"
    );
    assert_eq!(left.unacked, queued, "sent, never acknowledged");
    assert_eq!(
        queued + left.unsent,
        100_000,
        "{queued} in the queue, {left:?} left"
    );
}

#[tokio::test]
async fn shutdown_sends_what_the_ring_still_holds_and_waits_for_the_acknowledgement() {
    let rig = rig(10_000);
    let c = collector(&rig, true);
    rig.push("last", 3_000);
    let stopping = tokio::spawn(rig.stop(Duration::from_secs(5)));
    let mut got = Received::default();
    got.until(&c, 3_000, "last").await;
    assert_eq!(stopping.await.unwrap(), Left::default());
}

/// A collector that comes back under another user without any send failing (systemd keeps the
/// socket in place): its acknowledgements are taken once the socket file's owner is looked at
/// again.
#[tokio::test]
async fn a_collector_under_another_user_is_believed_once_its_socket_says_so() {
    let rig = rig(10_000);
    let c = collector(&rig, false);
    rig.push("newuser", 100);
    let mut got = Received::default();
    got.until(&c, 100, "newuser").await;
    let last = got.datagrams.last().unwrap().0;
    let ack = Ack::new(rig.sender, Some(last), None).encode();
    nix::unistd::chown(&rig.path, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    testkit::send_as_user(65534, &rig.ack_path, &ack).unwrap();
    await_acked(&rig, 100).await;
    assert_eq!(rig.metrics.acks_rejected.get(), 0);
    assert_eq!(rig.stop(Duration::from_secs(1)).await, Left::default());
}
