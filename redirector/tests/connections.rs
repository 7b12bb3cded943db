//! The redirect server's connection bounds, on the real binary over real sockets: at the
//! connection limit a new client is still served (the connection idle the longest makes room),
//! and idle, slow-to-send and never-reading clients are closed and counted by reason.

use std::time::{Duration, Instant};

use hyper::Method;
use testkit::http::request;
use testkit::redirector::{
    fixture, redirector_command, start_redirector, Fixture, Redirector, LIMIT,
};
use testkit::{eventually, limit_descriptors, raise_own_descriptor_limit};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CODE: &str = "c";
const URL: &str = "https://example.com/c";
/// Long enough that a few thousand unread responses fill the kernel's buffers.
const LONG_CODE: &str = "long";

/// What the redirector's descriptor limit is set to, as on a host with the default soft limit.
const NOFILE: u64 = 1_024;
/// What `--max-connections` (10,000 by default) is fitted to under it: (1024 - 64) / 5 * 4.
const FITTED: u64 = 768;
const IDLE_CLIENTS: u64 = 2_000;

async fn closed(r: &Redirector, reason: &str) -> f64 {
    r.metric(&format!(
        "redirector_connections_closed_total{{reason=\"{reason}\"}}"
    ))
    .await
}

/// Waits until the counter of connections closed for `reason` reaches `n`.
async fn await_closed(r: &Redirector, reason: &str, n: f64) {
    eventually(
        &format!("{n} connections closed as {reason}"),
        LIMIT,
        || async { (closed(r, reason).await >= n).then_some(()) },
    )
    .await;
}

/// Reads one response head (through the blank line) from `stream`.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(LIMIT, async {
        while !head.ends_with(b"\r\n\r\n") {
            let n = stream.read(&mut byte).await.expect("reading a response");
            assert!(
                n > 0,
                "connection closed after {:?}",
                String::from_utf8_lossy(&head)
            );
            head.push(byte[0]);
        }
    })
    .await
    .expect("a response head in time");
    String::from_utf8_lossy(&head).into_owned()
}

/// Waits until the server closes `stream` (EOF or reset); returns how long that took.
async fn await_close(stream: &mut TcpStream, what: &str) -> Duration {
    let start = Instant::now();
    let mut buf = [0u8; 512];
    tokio::time::timeout(LIMIT, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: the server did not close the connection in {LIMIT:?}"));
    start.elapsed()
}

#[tokio::test]
async fn at_1024_descriptors_with_2000_idle_connections_a_new_client_gets_its_302() {
    // This process holds thousands of sockets.
    raise_own_descriptor_limit(IDLE_CLIENTS + 200);
    let f = fixture(&[(CODE, URL)]).await;
    // Timeouts far away: the idle connections must be there when the new client comes.
    let mut cmd = redirector_command(
        &f.db.url,
        &f.socket,
        &["--idle-timeout", "10m", "--header-read-timeout", "10m"],
    );
    limit_descriptors(&mut cmd, NOFILE);
    let r = start_redirector(cmd).await;
    r.ready().await;
    r.service
        .wait_for_log(
            &format!("max connections fitted to the descriptor limit: {FITTED}"),
            LIMIT,
        )
        .await;
    assert_eq!(
        r.metric("redirector_connections_limit").await,
        FITTED as f64
    );

    let mut idle = Vec::new();
    for i in 0..IDLE_CLIENTS {
        let stream = TcpStream::connect(r.http)
            .await
            .unwrap_or_else(|e| panic!("idle connection {i}: {e}"));
        idle.push(stream);
    }
    let evicted = (IDLE_CLIENTS - FITTED) as f64;
    await_closed(&r, "evicted", evicted).await;
    assert_eq!(r.metric("redirector_connections").await, FITTED as f64);

    let response = tokio::time::timeout(LIMIT, request(r.http, Method::GET, "/c"))
        .await
        .expect("the new client is answered in time")
        .expect("an answer");
    assert_eq!(response.status(), 302);
    assert_eq!(response.headers()["location"], URL);
    assert_eq!(closed(&r, "evicted").await, evicted + 1.0);
    assert_eq!(closed(&r, "refused").await, 0.0);
    assert_eq!(
        r.metric("redirector_accept_errors_total").await,
        0.0,
        "the descriptors never ran out"
    );
    drop(idle);
}

/// A redirector with `--write-timeout 1s` and the other timeouts out of the way, ready, with
/// a link whose response is 1.6 KB ([`LONG_CODE`]), and its fixture.
async fn write_timeout_redirector() -> (Fixture, Redirector) {
    let long_url = format!("https://example.com/{}", "a".repeat(1_500));
    let f = fixture(&[(LONG_CODE, &long_url)]).await;
    let r = testkit::redirector::redirector(
        &f.db.url,
        &f.socket,
        &[
            "--write-timeout",
            "1s",
            "--idle-timeout",
            "10m",
            "--header-read-timeout",
            "10m",
        ],
    )
    .await;
    r.ready().await;
    (f, r)
}

/// A connection to `r` with a receive buffer of `bytes` (the kernel doubles it): what the
/// client leaves unread backs up into the server's send queue past that.
async fn with_window(r: &Redirector, bytes: u32) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(bytes).expect("SO_RCVBUF");
    socket.connect(r.http).await.expect("connect")
}

#[tokio::test]
async fn a_client_that_does_not_read_is_closed_by_the_write_timeout() {
    let (_f, r) = write_timeout_redirector().await;

    // Pipelined requests whose responses it never reads.
    let stream = with_window(&r, 4096).await;
    let (mut reader, mut writer) = stream.into_split();
    let requests = format!("HEAD /{LONG_CODE} HTTP/1.1\r\nHost: t\r\n\r\n").repeat(1_000);
    let sending = tokio::spawn(async move {
        // Until the server stops reading and then closes the connection.
        while writer.write_all(requests.as_bytes()).await.is_ok() {}
    });

    await_closed(&r, "write_timeout", 1.0).await;
    eventually("the connection to be closed", LIMIT, || async {
        (r.metric("redirector_connections").await == 0.0).then_some(())
    })
    .await;
    tokio::time::timeout(LIMIT, sending)
        .await
        .expect("the sender sees the connection closed")
        .expect("the sender task");
    let mut first = [0u8; 12];
    reader
        .read_exact(&mut first)
        .await
        .expect("responses were sent");
    assert_eq!(&first, b"HTTP/1.1 302");
    assert_eq!(closed(&r, "idle_timeout").await, 0.0);
    assert_eq!(closed(&r, "header_timeout").await, 0.0);
}

/// A client that pipelines requests without end and takes its responses a little at a time
/// makes room for another response well within the write timeout, again and again: it must
/// still be closed once it has not taken what was written before a stall for that long.
#[tokio::test]
async fn a_client_that_pipelines_without_end_and_reads_slowly_is_closed_by_the_write_timeout() {
    let (_f, r) = write_timeout_redirector().await;

    let stream = with_window(&r, 4096).await;
    let (mut reader, mut writer) = stream.into_split();
    let requests = format!("HEAD /{LONG_CODE} HTTP/1.1\r\nHost: t\r\n\r\n").repeat(1_000);
    let sending =
        tokio::spawn(async move { while writer.write_all(requests.as_bytes()).await.is_ok() {} });
    // Up to 4 KiB every 2 ms, 2 MB/s at most: room for a response well within the write
    // timeout (the kernel wakes a writer once a third of its send buffer is free), never a
    // whole send buffer in it (up to 4 MiB, about 2.6 MiB here).
    let reading = tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        let mut taken = 0usize;
        loop {
            tokio::time::sleep(Duration::from_millis(2)).await;
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return taken,
                Ok(n) => taken += n,
            }
        }
    });

    await_closed(&r, "write_timeout", 1.0).await;
    let taken = tokio::time::timeout(LIMIT, reading)
        .await
        .expect("the reader sees the connection closed")
        .expect("the reader task");
    assert!(
        taken > 64 * 1024,
        "the client took {taken} bytes: it must have read on, not stalled at once"
    );
    tokio::time::timeout(LIMIT, sending)
        .await
        .expect("the sender sees the connection closed")
        .expect("the sender task");
    assert_eq!(closed(&r, "idle_timeout").await, 0.0);
    assert_eq!(closed(&r, "header_timeout").await, 0.0);
}

/// A client that pipelines requests in bursts larger than the kernel's buffers and takes
/// each burst's responses gets every one, for longer than the write timeout: a stall its
/// reading ends is not a timeout.
#[tokio::test]
async fn a_client_that_pipelines_bursts_and_reads_them_gets_every_response() {
    const BURSTS: usize = 3;
    // 4,000 responses of 1.6 KB each are more than the client's receive buffer and the
    // server's send buffer (at most 4 MiB) hold: the server's writes wait on the reading.
    const BURST: usize = 4_000;
    let (_f, r) = write_timeout_redirector().await;

    // A small window, so that the server's writes wait on the client (a wider one, read at
    // once, keeps up with the server here). A stall ends once what was written before it is
    // taken, about a send buffer, a fraction of a burst.
    let mut stream = with_window(&r, 4096).await;
    let burst = format!("HEAD /{LONG_CODE} HTTP/1.1\r\nHost: t\r\n\r\n").repeat(BURST);
    // The bursts and the pauses between them (1.5 s in all) outlast the write timeout.
    for i in 0..BURSTS {
        let (mut reader, mut writer) = stream.split();
        let (sent, responses) = tokio::join!(
            writer.write_all(burst.as_bytes()),
            count_responses(&mut reader, BURST)
        );
        sent.expect("sending a burst");
        assert_eq!(responses, BURST, "burst {i}: the connection closed");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(closed(&r, "write_timeout").await, 0.0);
}

/// Reads from `reader` until it has seen `n` responses' status lines (`HTTP/1.1 302`) or the
/// connection ends; returns how many it saw.
async fn count_responses(reader: &mut (impl AsyncReadExt + Unpin), n: usize) -> usize {
    const STATUS: &[u8] = b"HTTP/1.1 302";
    let mut seen = 0;
    let mut tail = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(LIMIT, async {
        while seen < n {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(got) => tail.extend_from_slice(&buf[..got]),
            }
            seen += tail.windows(STATUS.len()).filter(|w| *w == STATUS).count();
            // What could begin a status line split across reads.
            tail.drain(..tail.len().saturating_sub(STATUS.len() - 1));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} responses in {LIMIT:?}; saw {seen}"));
    seen
}

/// A redirector with `timeouts`, a request answered on a keep-alive connection that then
/// stays idle until the server closes it: how long that took, and the fixture and redirector
/// for the caller's checks.
async fn idle_after_a_request(timeouts: &[&str]) -> (Fixture, Redirector, Duration) {
    let f = fixture(&[(CODE, URL)]).await;
    let r = testkit::redirector::redirector(&f.db.url, &f.socket, timeouts).await;
    r.ready().await;
    let mut stream = TcpStream::connect(r.http).await.expect("connect");
    stream
        .write_all(b"GET /c HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("request");
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 302"), "{head}");
    let idle = await_close(&mut stream, "idle keep-alive").await;
    (f, r, idle)
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let timeouts = ["--idle-timeout", "1s", "--header-read-timeout", "10m"];
    let (_f, r, idle) = idle_after_a_request(&timeouts).await;
    assert!(
        idle >= Duration::from_millis(900),
        "closed after {idle:?}, before the 1s idle timeout"
    );
    await_closed(&r, "idle_timeout", 1.0).await;
    assert_eq!(closed(&r, "header_timeout").await, 0.0);
    assert_eq!(r.metric("redirector_connections").await, 0.0);
}

/// hyper's header timer runs while a keep-alive connection waits for its next request: an
/// idle timeout longer than it ends there, and is counted as what it is, idle.
#[tokio::test]
async fn an_idle_connection_closed_at_the_header_read_timeout_is_counted_as_idle() {
    let timeouts = ["--idle-timeout", "10m", "--header-read-timeout", "1s"];
    let (_f, r, _) = idle_after_a_request(&timeouts).await;
    await_closed(&r, "idle_timeout", 1.0).await;
    assert_eq!(closed(&r, "header_timeout").await, 0.0);
}

#[tokio::test]
async fn a_request_head_not_finished_in_time_is_closed_as_a_header_timeout() {
    let f = fixture(&[(CODE, URL)]).await;
    let r = testkit::redirector::redirector(
        &f.db.url,
        &f.socket,
        &["--idle-timeout", "10m", "--header-read-timeout", "1s"],
    )
    .await;
    r.ready().await;

    let mut stream = TcpStream::connect(r.http).await.expect("connect");
    stream
        .write_all(b"GET /c HTTP/1.1\r\nHost: t\r\n")
        .await
        .expect("half a request head");
    await_close(&mut stream, "half a request head").await;
    await_closed(&r, "header_timeout", 1.0).await;
    assert_eq!(closed(&r, "idle_timeout").await, 0.0);
}

/// A request head that never ends, sent one byte at a time.
const ENDLESS_HEAD: &[u8] = b"GET /c HTTP/1.1\r\nHost: t\r\nX-Trickle: ";
/// How often a trickling client sends the next byte of its head.
const TRICKLE: Duration = Duration::from_secs(1);

/// A client that connects and then sends one byte of a request head every [`TRICKLE`], never
/// finishing it: the first byte is sent when this returns, the others by the task, which ends
/// when the server closes the connection. Returns the client's address and the task.
async fn trickler(
    server: std::net::SocketAddr,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let mut stream = TcpStream::connect(server).await.expect("connect");
    let local = stream.local_addr().expect("local address");
    let mut head = ENDLESS_HEAD.iter().copied().chain(std::iter::repeat(b'a'));
    let first = [head.next().expect("endless")];
    stream.write_all(&first).await.expect("the first byte");
    let task = tokio::spawn(async move {
        let (mut reader, mut writer) = stream.into_split();
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + TRICKLE, TRICKLE);
        let mut buf = [0u8; 512];
        loop {
            tokio::select! {
                read = reader.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(_) => panic!("a trickler got an answer to a head it never finished"),
                },
                _ = tick.tick() => {
                    let byte = [head.next().expect("endless")];
                    if writer.write_all(&byte).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    (local, task)
}

/// The queue sizes /proc/net/tcp shows for the IPv4 connection from `local` to `remote`:
/// (bytes sent and not acknowledged by the peer, bytes received and not read by the process).
fn tcp_queues(local: std::net::SocketAddr, remote: std::net::SocketAddr) -> Option<(u64, u64)> {
    let hex = |addr: std::net::SocketAddr| match addr {
        std::net::SocketAddr::V4(v4) => format!(
            "{:08X}:{:04X}",
            u32::from_le_bytes(v4.ip().octets()),
            v4.port()
        ),
        std::net::SocketAddr::V6(_) => panic!("an IPv4 address expected: {addr}"),
    };
    let (local, remote) = (hex(local), hex(remote));
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&local.as_str()) || fields.get(2) != Some(&remote.as_str()) {
            return None;
        }
        let (tx, rx) = fields.get(4)?.split_once(':')?;
        Some((
            u64::from_str_radix(tx, 16).ok()?,
            u64::from_str_radix(rx, 16).ok()?,
        ))
    })
}

/// Waits until the redirector at `server` has read every byte `client` had sent when this was
/// called:
/// first the redirector's kernel took them all (nothing unacknowledged at the client), then the
/// redirector read them all (nothing unread at its end).
async fn await_read_by_server(server: std::net::SocketAddr, client: std::net::SocketAddr) {
    eventually(
        &format!("the redirector to take the bytes {client} sent"),
        LIMIT,
        || async { (tcp_queues(client, server)?.0 == 0).then_some(()) },
    )
    .await;
    eventually(
        &format!("the redirector to read the bytes {client} sent"),
        LIMIT,
        || async { (tcp_queues(server, client)?.1 == 0).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn clients_trickling_request_heads_at_the_limit_do_not_lock_out_a_new_client() {
    const LIMIT_CONNECTIONS: usize = 4;
    let f = fixture(&[(CODE, URL)]).await;
    // Timeouts far away: only eviction can make room for the new client.
    let r = testkit::redirector::redirector(
        &f.db.url,
        &f.socket,
        &[
            "--max-connections",
            &LIMIT_CONNECTIONS.to_string(),
            "--idle-timeout",
            "10m",
            "--header-read-timeout",
            "10m",
        ],
    )
    .await;
    r.ready().await;
    assert_eq!(
        r.metric("redirector_connections_limit").await,
        LIMIT_CONNECTIONS as f64
    );

    // Every place taken by a client that has begun a request head and sends a byte of it
    // every second, each begun after the one before.
    let mut tricklers = Vec::new();
    for _ in 0..LIMIT_CONNECTIONS {
        let (client, task) = trickler(r.http).await;
        await_read_by_server(r.http, client).await;
        tricklers.push(task);
    }
    assert_eq!(
        r.metric("redirector_connections").await,
        LIMIT_CONNECTIONS as f64
    );

    let response = tokio::time::timeout(LIMIT, request(r.http, Method::GET, "/c"))
        .await
        .expect("the new client is answered in time")
        .expect("the new client is answered, not refused, while every place is trickling a head");
    assert_eq!(response.status(), 302);
    assert_eq!(response.headers()["location"], URL);
    assert_eq!(closed(&r, "evicted").await, 1.0);
    assert_eq!(closed(&r, "refused").await, 0.0);
    // The one that made room is the one whose head began first; the others still trickle.
    tokio::time::timeout(LIMIT, &mut tricklers[0])
        .await
        .expect("the trickler whose head began first is closed")
        .expect("the trickler task");
    assert!(
        tricklers[1..].iter().all(|t| !t.is_finished()),
        "only one trickler was to make room"
    );
    assert_eq!(closed(&r, "header_timeout").await, 0.0);
    for t in &tricklers {
        t.abort();
    }
}

#[tokio::test]
async fn a_request_head_trickled_byte_by_byte_is_closed_at_the_header_read_timeout() {
    let f = fixture(&[(CODE, URL)]).await;
    let r = testkit::redirector::redirector(
        &f.db.url,
        &f.socket,
        &["--idle-timeout", "10m", "--header-read-timeout", "3s"],
    )
    .await;
    r.ready().await;

    // A byte every second keeps arriving; the head as a whole is late all the same. (Were the
    // timeout counted per byte, the connection would stay open and the wait below run out.)
    let start = Instant::now();
    let (_, task) = trickler(r.http).await;
    tokio::time::timeout(LIMIT, task)
        .await
        .expect("the trickling client is closed in time")
        .expect("the trickler task");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(2_900),
        "closed after {took:?}, before the 3s header read timeout"
    );
    await_closed(&r, "header_timeout", 1.0).await;
    assert_eq!(closed(&r, "idle_timeout").await, 0.0);
}

/// Under systemd both listeners come from socket units (redirector.socket,
/// redirector-admin.socket), each found by its name in LISTEN_FDNAMES whatever the order.
#[tokio::test]
async fn listeners_passed_by_systemd_are_taken_by_name() {
    use std::os::fd::AsRawFd;
    let f = fixture(&[(CODE, URL)]).await;
    let admin = std::net::TcpListener::bind("127.0.0.1:0").expect("admin listener");
    let http = std::net::TcpListener::bind("127.0.0.1:0").expect("http listener");
    let (admin_addr, http_addr) = (admin.local_addr().unwrap(), http.local_addr().unwrap());
    let cmd = redirector_command(&f.db.url, &f.socket, &[]);
    let cmd = testkit::socket_activated_named(
        &cmd,
        &[("admin", admin.as_raw_fd()), ("http", http.as_raw_fd())],
    );
    let r = start_redirector(cmd).await;
    drop((admin, http));
    assert_eq!((r.http, r.admin), (http_addr, admin_addr));
    r.service
        .wait_for_log(
            &format!("http listening on {http_addr} (from systemd)"),
            LIMIT,
        )
        .await;
    r.ready().await;
    let response = request(http_addr, Method::GET, "/c")
        .await
        .expect("an answer");
    assert_eq!(response.status(), 302);
}
