//! A small HTTP load generator for the tests and the benchmark: N tasks, each with its own
//! keep-alive HTTP/1 connection (hyper's client conn over a TcpStream), sharing one request
//! budget or running for a duration, as fast as answered or at a rate ([`Load::rate`]), each
//! request's path fixed or drawn per request (a code
//! mix), each request's headers none or drawn per request ([`Headers`]), each answer's latency
//! recorded in a histogram.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

use std::fmt::Write as _;

use super::browsers::Headers;
use crate::XorShift;

/// How long a test's [`Load::run`] may take: well past any test's load on a loaded machine,
/// and a bound where a service that stopped answering held the test for good.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// What the clients saw.
#[derive(Debug, Default)]
pub struct Report {
    pub statuses: BTreeMap<u16, u64>,
    /// Requests that got no answer (the connection failed or closed); each ends its task.
    pub errors: u64,
    pub max_latency: Duration,
    /// The latency of every answered request.
    pub latencies: Histogram,
}

impl Report {
    pub fn count(&self, status: u16) -> u64 {
        self.statuses.get(&status).copied().unwrap_or(0)
    }

    /// Checks that every request was answered, each with a redirect; returns how many.
    pub fn all_redirected(&self, what: &str) -> u64 {
        assert_eq!(
            self.errors, 0,
            "{what}: requests without an answer: {self:?}"
        );
        let redirects = self.count(302);
        assert_eq!(
            redirects,
            self.total(),
            "{what}: answers other than 302: {self:?}"
        );
        redirects
    }

    pub fn total(&self) -> u64 {
        self.statuses.values().sum()
    }

    fn merge(&mut self, other: Report) {
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_default() += n;
        }
        self.errors += other.errors;
        self.max_latency = self.max_latency.max(other.max_latency);
        self.latencies.merge(&other.latencies);
    }
}

/// Latencies in microseconds, in buckets of at most 1/64 of their value (64 per power of two,
/// exact below 128 us): percentiles within 1.6 % without keeping every sample, and cheap
/// enough to record on every request. A fixed-bucket stand-in for an HDR histogram.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
}

/// Buckets of one power of two (and the exact values below the first one).
const SUB_BUCKETS: usize = 64;
/// Powers of two above the exact range: up to 2^(7+40) us, beyond any latency seen.
const OCTAVES: usize = 40;

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            counts: vec![0; 2 * SUB_BUCKETS + OCTAVES * SUB_BUCKETS],
        }
    }
}

impl Histogram {
    pub fn record(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let i = Self::index(us).min(self.counts.len() - 1);
        self.counts[i] += 1;
    }

    fn index(us: u64) -> usize {
        if us < 2 * SUB_BUCKETS as u64 {
            return us as usize;
        }
        let shift = (63 - us.leading_zeros()) as usize - SUB_BUCKETS.trailing_zeros() as usize;
        let sub = (us >> shift) as usize - SUB_BUCKETS;
        2 * SUB_BUCKETS + (shift - 1) * SUB_BUCKETS + sub
    }

    /// The middle of bucket `i`, in microseconds.
    fn value(i: usize) -> f64 {
        if i < 2 * SUB_BUCKETS {
            return i as f64;
        }
        let shift = (i - 2 * SUB_BUCKETS) / SUB_BUCKETS + 1;
        let sub = (i - 2 * SUB_BUCKETS) % SUB_BUCKETS + SUB_BUCKETS;
        let low = (sub as u64) << shift;
        low as f64 + ((1u64 << shift) as f64 - 1.0) / 2.0
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The latency below which fraction `q` (0 to 1) of the requests fell; none if nothing
    /// was recorded.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        let i = self.counts.iter().position(|&n| {
            seen += n;
            seen >= rank
        })?;
        Some(Duration::from_secs_f64(Self::value(i) / 1e6))
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }
}

/// Draws a request's path: `random` is the connection's own stream, `path` a reused buffer
/// the path is written into (cleared first).
pub type Paths = Arc<dyn Fn(&mut XorShift, &mut String) + Send + Sync>;

/// One load run: `method path` on `connections` connections until `requests` were made or
/// `stop` is set, whichever comes first.
#[derive(Clone)]
pub struct Load {
    pub addr: SocketAddr,
    pub method: Method,
    pub path: String,
    pub connections: usize,
    pub stop: Arc<AtomicBool>,
    /// When set, each request's path is drawn by it instead of being `path`.
    pub paths: Option<Paths>,
    /// When set, each request carries a block of header lines drawn by it (besides `Host`).
    pub headers: Option<Arc<Headers>>,
    pub client: Client,
    /// After a request that got no answer, connect again (after 10 ms) and go on, as clients
    /// of a server that restarts do; without it the connection's task ends.
    pub reconnect: bool,
    /// Requests a second of all the connections together; none: each as fast as it gets
    /// answers. Under a rate, modes compare at the same work rather than at what each reaches.
    pub rate: Option<f64>,
}

/// How the connections speak HTTP/1.1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Client {
    /// hyper's client connection: a whole HTTP client, what the tests use.
    #[default]
    Hyper,
    /// Requests written and answers read straight on the socket: only answers that carry a
    /// Content-Length (hyper's server sends one for every body it knows the size of). Much
    /// less CPU per request than hyper's client (no channel and task between the caller and
    /// the connection), so that on shared cores the generator leaves the server it measures
    /// about as much as wrk does.
    Plain,
}

impl Load {
    pub fn get(addr: SocketAddr, path: &str) -> Load {
        Load {
            addr,
            method: Method::GET,
            path: path.to_owned(),
            connections: 50,
            stop: Arc::new(AtomicBool::new(false)),
            paths: None,
            headers: None,
            client: Client::Hyper,
            reconnect: false,
            rate: None,
        }
    }

    pub fn method(mut self, method: Method) -> Load {
        self.method = method;
        self
    }

    /// Makes `requests` requests (fewer if stopped or if connections fail); panics if they
    /// take over [`RUN_LIMIT`] (a service that stopped answering), rather than waiting on.
    pub async fn run(&self, requests: u64) -> Report {
        let run = tokio::time::timeout(RUN_LIMIT, self.requests(requests));
        run.await
            .unwrap_or_else(|_| panic!("{requests} requests not answered within {RUN_LIMIT:?}"))
    }

    async fn requests(&self, requests: u64) -> Report {
        let budget = Arc::new(AtomicU64::new(requests));
        let tasks: Vec<_> = (0..self.connections)
            .map(|_| {
                let load = self.clone();
                let budget = budget.clone();
                tokio::spawn(async move { load.connections_in_turn(budget).await })
            })
            .collect();
        let mut report = Report::default();
        for task in tasks {
            report.merge(task.await.expect("load task"));
        }
        report
    }

    /// Runs for `duration` (or until stopped); the report, and the time from the start until
    /// every connection ended (each finishes the request it has in flight).
    pub async fn run_for(&self, duration: Duration) -> (Report, Duration) {
        let start = Instant::now();
        let stop = self.stop.clone();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            stop.store(true, Relaxed);
        });
        let report = self.requests(u64::MAX).await;
        timer.abort();
        (report, start.elapsed())
    }

    /// Runs until [`Load::stop`] is set; returns the task that gives the report.
    pub fn start(&self) -> tokio::task::JoinHandle<Report> {
        let load = self.clone();
        tokio::spawn(async move { load.requests(u64::MAX).await })
    }

    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
    }

    /// One connection's requests until one gets no answer (then, with `reconnect`, the next
    /// connection's, after 10 ms), the budget is spent or the load is stopped.
    async fn connections_in_turn(self, budget: Arc<AtomicU64>) -> Report {
        let mut report = Report::default();
        loop {
            let one = match self.client {
                Client::Hyper => self.clone().connection(budget.clone()).await,
                Client::Plain => self.clone().plain_connection(budget.clone()).await,
            };
            let cut_off = one.errors > 0;
            report.merge(one);
            if !self.reconnect || !cut_off || self.stop.load(Relaxed) {
                return report;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn connection(self, budget: Arc<AtomicU64>) -> Report {
        let mut report = Report::default();
        let mut random = XorShift(seed());
        let mut path = String::new();
        let Ok(stream) = tokio::net::TcpStream::connect(self.addr).await else {
            report.errors += 1;
            return report;
        };
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) =
            match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
                Ok(pair) => pair,
                Err(_) => {
                    report.errors += 1;
                    return report;
                }
            };
        tokio::spawn(connection);
        let mut pace = self.pace();
        while pace.next(&self.stop).await && self.take_one(&budget) {
            let mut request = Request::builder()
                .method(self.method.clone())
                .uri(self.next_path(&mut random, &mut path))
                .header(hyper::header::HOST, "load");
            if let Some(headers) = &self.headers {
                let lines = headers.pick(&mut random).split_terminator("\r\n");
                for (name, value) in lines.filter_map(|l| l.split_once(": ")) {
                    request = request.header(name, value);
                }
            }
            let request = request.body(Empty::<Bytes>::new()).expect("valid request");
            let start = Instant::now();
            let answered = match sender.send_request(request).await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    response.into_body().collect().await.map(|_| status).ok()
                }
                Err(_) => None,
            };
            let Some(status) = answered else {
                report.errors += 1;
                break;
            };
            let latency = start.elapsed();
            report.max_latency = report.max_latency.max(latency);
            report.latencies.record(latency);
            *report.statuses.entry(status).or_default() += 1;
        }
        report
    }
}

/// A connection's share of [`Load::rate`]: its `k`th request is due `(k + phase) / share`
/// seconds after it starts, `phase` drawn in [0, 1) so that the connections do not all send
/// on the same tick; one that falls behind sends at once until it is on time again. A share
/// that is not a positive rate (zero, negative, NaN) never sends.
struct Pace {
    /// Requests a second of this connection; none: unpaced.
    share: Option<f64>,
    phase: f64,
    start: tokio::time::Instant,
    k: u64,
}

/// The longest a paced connection sleeps before it looks at `stop` again.
const PACE_SLICE: Duration = Duration::from_millis(50);

impl Pace {
    /// Waits until the next request is due (true), or until `stop` is set (false).
    async fn next(&mut self, stop: &AtomicBool) -> bool {
        let Some(share) = self.share else {
            return !stop.load(Relaxed);
        };
        let offset = Duration::try_from_secs_f64((self.k as f64 + self.phase) / share).ok();
        let due = offset.and_then(|o| self.start.checked_add(o));
        self.k += 1;
        loop {
            if stop.load(Relaxed) {
                return false;
            }
            let now = tokio::time::Instant::now();
            match due {
                Some(due) if due <= now => return true,
                Some(due) => tokio::time::sleep_until(due.min(now + PACE_SLICE)).await,
                None => tokio::time::sleep(PACE_SLICE).await,
            }
        }
    }
}

impl Load {
    fn pace(&self) -> Pace {
        Pace {
            share: self.rate.map(|r| r / self.connections.max(1) as f64),
            phase: (seed() >> 11) as f64 / (1u64 << 53) as f64,
            start: tokio::time::Instant::now(),
            k: 0,
        }
    }

    fn take_one(&self, budget: &AtomicU64) -> bool {
        !self.stop.load(Relaxed)
            && budget
                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                .is_ok()
    }

    /// [`Client::Plain`]'s connection: one request written whole, one answer read, in turn.
    async fn plain_connection(self, budget: Arc<AtomicU64>) -> Report {
        use tokio::io::AsyncWriteExt;
        let mut report = Report::default();
        let Ok(mut stream) = tokio::net::TcpStream::connect(self.addr).await else {
            report.errors += 1;
            return report;
        };
        let _ = stream.set_nodelay(true);
        let (mut random, mut path) = (XorShift(seed()), String::new());
        let mut request = String::new();
        let mut answer = Answer::default();
        let head_only = self.method == Method::HEAD;
        let mut pace = self.pace();
        while pace.next(&self.stop).await && self.take_one(&budget) {
            request.clear();
            let path = self.next_path(&mut random, &mut path);
            let _ = write!(request, "{} {path} HTTP/1.1\r\nHost: load\r\n", self.method);
            if let Some(headers) = &self.headers {
                request.push_str(headers.pick(&mut random));
            }
            request.push_str("\r\n");
            let start = Instant::now();
            let status = match stream.write_all(request.as_bytes()).await {
                Ok(()) => answer.read(&mut stream, head_only).await,
                Err(_) => None,
            };
            let Some(status) = status else {
                report.errors += 1;
                break;
            };
            let latency = start.elapsed();
            report.max_latency = report.max_latency.max(latency);
            report.latencies.record(latency);
            *report.statuses.entry(status).or_default() += 1;
        }
        report
    }

    fn next_path<'a>(&'a self, random: &mut XorShift, buf: &'a mut String) -> &'a str {
        match &self.paths {
            Some(paths) => {
                buf.clear();
                paths(random, buf);
                buf.as_str()
            }
            None => self.path.as_str(),
        }
    }
}

/// A connection's read buffer: the bytes read past one answer are the next one's start.
#[derive(Default)]
struct Answer {
    buf: Vec<u8>,
    filled: usize,
}

/// The largest answer head or body [`Answer`] takes.
const MAX_ANSWER: usize = 1 << 20;

impl Answer {
    /// Reads one answer; its status, or none if the connection ended or the answer is not
    /// one this client reads.
    async fn read(&mut self, stream: &mut tokio::net::TcpStream, head_only: bool) -> Option<u16> {
        let end = loop {
            if let Some(end) = self.buf[..self.filled]
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
            {
                break end;
            }
            self.fill(stream).await?;
        };
        let head = std::str::from_utf8(&self.buf[..end]).ok()?;
        let status = head.get(9..12)?.parse().ok()?;
        let length = if head_only { 0 } else { content_length(head)? };
        let total = end + 4 + length;
        while self.filled < total {
            self.fill(stream).await?;
        }
        self.buf.copy_within(total..self.filled, 0);
        self.filled -= total;
        Some(status)
    }

    /// Reads more from the socket, growing the buffer when it is full.
    async fn fill(&mut self, stream: &mut tokio::net::TcpStream) -> Option<()> {
        use tokio::io::AsyncReadExt;
        if self.filled == self.buf.len() {
            if self.buf.len() >= MAX_ANSWER {
                return None;
            }
            self.buf.resize((self.buf.len() * 2).max(4096), 0);
        }
        match stream.read(&mut self.buf[self.filled..]).await {
            Ok(0) | Err(_) => None,
            Ok(n) => {
                self.filled += n;
                Some(())
            }
        }
    }
}

/// The Content-Length of an answer's head (0 if it has none: an answer without a body); none
/// for a chunked one.
fn content_length(head: &str) -> Option<usize> {
    let header = |wanted: &str| {
        head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case(wanted).then_some(value.trim())
        })
    };
    if header("transfer-encoding").is_some() {
        return None;
    }
    match header("content-length") {
        Some(v) => v.parse().ok().filter(|&n| n <= MAX_ANSWER),
        None => Some(0),
    }
}

/// A different nonzero seed for each connection (xorshift stays at zero from zero).
fn seed() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ NEXT.fetch_add(0x9e37_79b9_7f4a_7c15, Relaxed)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_within_a_bucket() {
        let mut h = Histogram::default();
        for us in 1..=10_000u64 {
            h.record(Duration::from_micros(us));
        }
        for (q, want) in [(0.5, 5_000.0), (0.99, 9_900.0), (1.0, 10_000.0)] {
            let got = h.quantile(q).expect("recorded").as_secs_f64() * 1e6;
            assert!((got - want).abs() / want < 0.02, "q {q}: {got} vs {want}");
        }
        assert_eq!(
            h.quantile(0.5).map(|d| d.as_micros()),
            Some(5_000 - 5_000 % 64 + 31)
        );
    }

    /// A server that answers every request on its connections with `answer`; the request
    /// heads it read, each connection's in turn.
    async fn canned(answer: &'static [u8]) -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let (mut buf, mut pending) = ([0u8; 4096], Vec::new());
                    while let Ok(n @ 1..) = socket.read(&mut buf).await {
                        pending.extend_from_slice(&buf[..n]);
                        // A head may arrive in pieces: answer only whole ones.
                        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head: Vec<u8> = pending.drain(..end + 4).collect();
                            let head = String::from_utf8_lossy(&head).into_owned();
                            seen.lock().expect("heads").push(head);
                            if socket.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, heads)
    }

    #[tokio::test]
    async fn the_plain_client_reads_answers_with_and_without_bodies() {
        for answer in [
            &b"HTTP/1.1 302 Found\r\nlocation: /x\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found",
        ] {
            let (addr, _) = canned(answer).await;
            let load = Load {
                connections: 3,
                client: Client::Plain,
                ..Load::get(addr, "/a")
            };
            let report = load.run(1_000).await;
            assert_eq!(
                report.total(),
                1_000,
                "{:?}",
                String::from_utf8_lossy(answer)
            );
            assert_eq!(report.errors, 0);
            assert_eq!(report.latencies.count(), 1_000);
        }
    }

    #[tokio::test]
    async fn both_clients_send_the_drawn_headers() {
        let answer = b"HTTP/1.1 302 Found\r\nlocation: /x\r\ncontent-length: 0\r\n\r\n";
        let browsers = Headers::browsers();
        for client in [Client::Plain, Client::Hyper] {
            let (addr, heads) = canned(answer).await;
            let load = Load {
                connections: 2,
                client,
                headers: Some(browsers.clone()),
                ..Load::get(addr, "/a")
            };
            assert_eq!(load.run(500).await.total(), 500, "{client:?}");
            let heads = heads.lock().expect("heads");
            assert_eq!(heads.len(), 500, "{client:?}");
            let mut blocks = std::collections::BTreeSet::new();
            for head in heads.iter() {
                // Every line past the request line and Host is one of a block's, in order.
                let lines: Vec<&str> = head.split_terminator("\r\n").collect();
                let block: String = lines[1..]
                    .iter()
                    .filter(|l| !l.is_empty() && !l.eq_ignore_ascii_case("host: load"))
                    .map(|l| format!("{l}\r\n"))
                    .collect();
                let sent = browsers
                    .blocks()
                    .iter()
                    .find(|b| b.eq_ignore_ascii_case(&block));
                assert!(sent.is_some(), "{client:?}: {head:?}");
                blocks.insert(block.to_ascii_lowercase());
            }
            assert!(blocks.len() > 100, "{client:?}: {} blocks", blocks.len());
        }
    }

    #[tokio::test]
    async fn a_rate_spreads_the_requests_over_time() {
        let answer = b"HTTP/1.1 302 Found\r\ncontent-length: 0\r\n\r\n";
        for client in [Client::Plain, Client::Hyper] {
            let (addr, _) = canned(answer).await;
            let load = Load {
                connections: 4,
                client,
                rate: Some(400.0),
                ..Load::get(addr, "/a")
            };
            // 100 requests a connection at 100 a second: the last is due 0.99 s (and at most
            // 1 s) after the start, not sooner; at half the rate, 1.98 s (a bound with room for
            // a loaded machine: what is checked is the pace, not the speed).
            let start = Instant::now();
            assert_eq!(load.run(400).await.total(), 400, "{client:?}");
            let took = start.elapsed();
            assert!(took >= Duration::from_millis(990), "{client:?}: {took:?}");
            assert!(took < Duration::from_millis(1_700), "{client:?}: {took:?}");
        }
    }

    #[tokio::test]
    async fn a_stop_ends_a_paced_load_that_is_waiting() {
        let answer = b"HTTP/1.1 302 Found\r\ncontent-length: 0\r\n\r\n";
        let (addr, _) = canned(answer).await;
        // A request a connection every 100 s: each waits for the stop, before its first or
        // its second.
        let load = Load {
            connections: 2,
            client: Client::Plain,
            rate: Some(0.02),
            ..Load::get(addr, "/a")
        };
        let run = load.run_for(Duration::from_millis(300));
        let (report, _) = tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .expect("the stop ends connections waiting for their next request");
        assert!(report.total() <= 2, "{report:?}");
    }

    #[tokio::test]
    async fn without_headers_a_request_is_its_line_and_host() {
        let answer = b"HTTP/1.1 302 Found\r\ncontent-length: 0\r\n\r\n";
        let (addr, heads) = canned(answer).await;
        let load = Load {
            connections: 1,
            client: Client::Plain,
            ..Load::get(addr, "/a")
        };
        assert_eq!(load.run(3).await.total(), 3);
        let heads = heads.lock().expect("heads");
        assert!(heads
            .iter()
            .all(|h| h == "GET /a HTTP/1.1\r\nHost: load\r\n\r\n"));
    }

    #[test]
    fn histogram_indexes_are_monotonic_and_in_range() {
        let mut last = 0;
        for us in (0..1u64 << 30).step_by(997) {
            let i = Histogram::index(us);
            assert!(i >= last && i < Histogram::default().counts.len(), "{us}");
            assert!(Histogram::value(i) <= (us as f64) * 1.016 + 1.0, "{us}");
            last = i;
        }
    }
}
