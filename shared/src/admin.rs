//! The admin listener each process runs beside its real work: `GET /metrics` (OpenMetrics
//! text) and `GET /healthz` (200 once ready, 503 before).
//!
//! Its connections are bounded, so that clients holding them open cannot take the descriptors
//! the process needs for its real work (the collector runs under `LimitNOFILE=1024`): at most
//! [`MAX_CONNECTIONS`] at once. At the bound a new connection takes the place of the one that
//! has gone the longest without a request answered (`evicted`), so a scraper on a fresh
//! connection is answered however many clients hold theirs; it is closed at once only when
//! every connection is being answered that instant (`refused`). A connection that sends no
//! whole request head within [`HEADER_READ_TIMEOUT`] of the server's waiting for one is closed,
//! so an idle keep-alive connection does not keep its place either.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// How long a client may take to send a whole request head, counted from when the server
/// began waiting for it: after the connection opened, or after the previous response.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Admin connections open at once: a Prometheus or two, a health check and a person with curl
/// need a handful. Small beside the descriptors each process keeps for the rest of its work
/// (the redirector keeps 64 out of its connection limit for everything but client connections).
pub const MAX_CONNECTIONS: usize = 16;
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

crate::label! {
    /// Why the admin listener closed a connection itself, to stay within [`MAX_CONNECTIONS`].
    pub enum Closed: "reason" {
        /// At the bound, it had gone the longest without a request answered when a new
        /// connection came.
        Evicted = "evicted",
        /// A new connection at the bound while every connection was being answered: closed at
        /// once.
        Refused = "refused",
    }
}

/// What a process exposes on its admin listener.
pub trait Admin: Send + Sync + 'static {
    /// The whole OpenMetrics exposition, `# EOF` included.
    fn metrics(&self) -> String;
    /// Whether the process is doing its job (`/healthz` says 200), and if not, why.
    fn health(&self) -> Result<(), String>;
    /// Counts a connection the listener closed itself (`<prefix>_admin_connections_closed_total`).
    fn connection_closed(&self, why: Closed);
}

/// Serves the admin endpoints on `listener` until the task is aborted or the process exits.
pub fn spawn(listener: TcpListener, admin: Arc<dyn Admin>) -> tokio::task::JoinHandle<()> {
    spawn_bounded(listener, admin, MAX_CONNECTIONS, HEADER_READ_TIMEOUT)
}

fn spawn_bounded(
    listener: TcpListener,
    admin: Arc<dyn Admin>,
    max_connections: usize,
    header_read_timeout: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let places = Places::new(max_connections);
        // Ten lines a second for as long as the descriptors are out, otherwise.
        let mut accept_log = crate::throttle::Throttle::default();
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, typically: pause instead of spinning on it.
                    if let Some(held_back) = accept_log.allow() {
                        tracing::warn!("admin accept: {e}; {held_back} more since the last line");
                    }
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            };
            // Dropping the stream closes it: never a wait in this loop.
            let place = match places.admit() {
                Admitted::Free(place) => place,
                Admitted::Evicting(place) => {
                    admin.connection_closed(Closed::Evicted);
                    place
                }
                Admitted::Refused => {
                    admin.connection_closed(Closed::Refused);
                    continue;
                }
            };
            let admin = admin.clone();
            tokio::spawn(async move {
                let conn = place.conn.clone();
                let service = hyper::service::service_fn(move |req| {
                    let answering = conn.begin_request();
                    let response = answer(&*admin, &req);
                    drop(answering);
                    async move { Ok::<_, Infallible>(response) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(header_read_timeout)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = connection => {}
                    // A stored permit: told to go even before this task first ran.
                    () = place.conn.evicted.notified() => {}
                }
                drop(place);
            });
        }
    })
}

/// One admin connection's state, shared by its task and the listener's [`Places`].
#[derive(Debug)]
struct Conn {
    id: u64,
    /// The listener's count of events (a connection opened, a request answered).
    events: Arc<AtomicU64>,
    /// That count when it opened or its last request was answered: the order of activity.
    active: AtomicU64,
    /// Requests being answered.
    answering: AtomicU32,
    evicted: Notify,
}

impl Conn {
    fn begin_request(self: &Arc<Self>) -> Answering {
        self.answering.fetch_add(1, Relaxed);
        Answering(self.clone())
    }

    /// When it last did anything, unless it is being answered now.
    fn evictable_since(&self) -> Option<u64> {
        (self.answering.load(Relaxed) == 0).then(|| self.active.load(Relaxed))
    }
}

/// A request being answered; when dropped, the connection's last activity.
struct Answering(Arc<Conn>);

impl Drop for Answering {
    fn drop(&mut self) {
        let now = self.0.events.fetch_add(1, Relaxed);
        self.0.active.store(now, Relaxed);
        self.0.answering.fetch_sub(1, Relaxed);
    }
}

/// The open admin connections, up to the bound.
struct Places {
    limit: usize,
    events: Arc<AtomicU64>,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    by_id: HashMap<u64, Arc<Conn>>,
}

enum Admitted {
    /// Under the bound.
    Free(Place),
    /// At the bound: the connection gone the longest without a request answered was told to
    /// close, and this one has its place.
    Evicting(Place),
    /// At the bound with every connection being answered.
    Refused,
}

impl Places {
    fn new(limit: usize) -> Arc<Places> {
        Arc::new(Places {
            limit,
            events: Arc::default(),
            open: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Open> {
        // Nothing panics while holding it; a poisoned lock still holds consistent data.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn admit(self: &Arc<Self>) -> Admitted {
        let mut open = self.lock();
        let evicting = open.by_id.len() >= self.limit;
        if evicting {
            let oldest = open
                .by_id
                .values()
                .filter_map(|c| Some((c.evictable_since()?, c.id)))
                .min();
            let Some(conn) = oldest.and_then(|(_, id)| open.by_id.remove(&id)) else {
                return Admitted::Refused;
            };
            conn.evicted.notify_one();
        }
        open.next_id += 1;
        let conn = Arc::new(Conn {
            id: open.next_id,
            events: self.events.clone(),
            active: AtomicU64::new(self.events.fetch_add(1, Relaxed)),
            answering: AtomicU32::new(0),
            evicted: Notify::new(),
        });
        open.by_id.insert(conn.id, conn.clone());
        let place = Place {
            conn,
            places: self.clone(),
        };
        if evicting {
            Admitted::Evicting(place)
        } else {
            Admitted::Free(place)
        }
    }
}

/// A connection's place among the open ones, given back when dropped.
struct Place {
    conn: Arc<Conn>,
    places: Arc<Places>,
}

impl Drop for Place {
    fn drop(&mut self) {
        // An evicted connection gave its place up already.
        self.places.lock().by_id.remove(&self.conn.id);
    }
}

fn answer(admin: &dyn Admin, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let reply_as = |status, content_type: &str, body: String| {
        Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)))
            .expect("static response parts are valid")
    };
    let reply = |status, body| reply_as(status, "text/plain; charset=utf-8", body);
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut refused = reply(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD only\n".into());
        let allowed = hyper::header::HeaderValue::from_static("GET, HEAD");
        refused.headers_mut().insert(hyper::header::ALLOW, allowed);
        return refused;
    }
    match req.uri().path() {
        "/metrics" => reply_as(
            StatusCode::OK,
            crate::metrics::CONTENT_TYPE,
            admin.metrics(),
        ),
        "/healthz" => match admin.health() {
            Ok(()) => reply(StatusCode::OK, "ok\n".into()),
            Err(why) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        _ => reply(StatusCode::NOT_FOUND, "try /metrics or /healthz\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Label;
    use std::time::Instant;
    use testkit::http::get;
    use testkit::LIMIT;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    #[derive(Default)]
    struct Fixed {
        ready: bool,
        closed: [AtomicU64; 2],
    }

    impl Admin for Fixed {
        fn metrics(&self) -> String {
            "up 1\n".into()
        }
        fn health(&self) -> Result<(), String> {
            if self.ready {
                Ok(())
            } else {
                Err("database not reached".into())
            }
        }
        fn connection_closed(&self, why: Closed) {
            self.closed[why.index()].fetch_add(1, Relaxed);
        }
    }

    impl Fixed {
        fn closed(&self, why: Closed) -> u64 {
            self.closed[why.index()].load(Relaxed)
        }
    }

    async fn serve_with(
        fixed: Fixed,
        max_connections: usize,
        header_read_timeout: Duration,
    ) -> (std::net::SocketAddr, Arc<Fixed>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let fixed = Arc::new(fixed);
        spawn_bounded(
            listener,
            fixed.clone(),
            max_connections,
            header_read_timeout,
        );
        (addr, fixed)
    }

    async fn serve(ready: bool) -> std::net::SocketAddr {
        let fixed = Fixed {
            ready,
            ..Fixed::default()
        };
        serve_with(fixed, MAX_CONNECTIONS, HEADER_READ_TIMEOUT)
            .await
            .0
    }

    /// Waits until the server closes `stream` (EOF or reset).
    async fn closed_by_server(stream: &mut TcpStream, what: &str) {
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
        .unwrap_or_else(|_| panic!("{what}: not closed by the server in {LIMIT:?}"));
    }

    #[tokio::test]
    async fn serves_metrics_and_health() {
        let addr = serve(true).await;
        assert_eq!(get(addr, "/metrics").await.unwrap(), (200, "up 1\n".into()));
        assert_eq!(get(addr, "/healthz").await.unwrap(), (200, "ok\n".into()));
        assert_eq!(get(addr, "/nope").await.unwrap().0, 404);
    }

    /// Another method is refused with the methods it takes (RFC 9110, 15.5.6).
    #[tokio::test]
    async fn another_method_is_refused_with_the_methods_taken() {
        let addr = serve(true).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request =
            b"POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        stream.write_all(request).await.unwrap();
        let mut response = String::new();
        let read = stream.read_to_string(&mut response);
        tokio::time::timeout(LIMIT, read).await.unwrap().unwrap();
        assert!(response.starts_with("HTTP/1.1 405"), "{response}");
        let allow = response
            .to_ascii_lowercase()
            .contains("\r\nallow: get, head\r\n");
        assert!(allow, "{response}");
    }

    #[tokio::test]
    async fn health_says_why_it_is_not_ready() {
        let addr = serve(false).await;
        let (status, body) = get(addr, "/healthz").await.unwrap();
        assert_eq!(status, 503);
        assert!(body.contains("database not reached"), "{body}");
    }

    #[tokio::test]
    async fn at_the_bound_a_new_connection_takes_the_place_of_the_longest_unanswered() {
        let (addr, fixed) = serve_with(Fixed::default(), 2, LIMIT).await;
        let mut first = TcpStream::connect(addr).await.unwrap();
        let mut second = TcpStream::connect(addr).await.unwrap();
        // The first is answered now: the second has gone longer without an answer.
        first
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let mut response = [0u8; 12];
        first.read_exact(&mut response).await.unwrap();
        assert_eq!(&response, b"HTTP/1.1 503");
        // Fresh connections are answered, each taking a place; the second goes first.
        let (status, _) = get(addr, "/metrics").await.unwrap();
        assert_eq!(status, 200);
        closed_by_server(&mut second, "the longest unanswered").await;
        assert_eq!(fixed.closed(Closed::Evicted), 1);
        assert_eq!(fixed.closed(Closed::Refused), 0);
    }

    #[test]
    fn refused_only_while_every_connection_is_being_answered() {
        let places = Places::new(2);
        let Admitted::Free(first) = places.admit() else {
            panic!("a free place")
        };
        let Admitted::Free(second) = places.admit() else {
            panic!("a free place")
        };
        let answering = (first.conn.begin_request(), second.conn.begin_request());
        assert!(matches!(places.admit(), Admitted::Refused));
        drop(answering);
        let Admitted::Evicting(_third) = places.admit() else {
            panic!("an evicted place")
        };
        assert_eq!(places.lock().by_id.len(), 2);
        drop((first, second));
        assert_eq!(
            places.lock().by_id.len(),
            1,
            "an evicted place is not given twice"
        );
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_is_closed_after_the_header_read_timeout() {
        let timeout = Duration::from_millis(300);
        let (addr, _) = serve_with(Fixed::default(), MAX_CONNECTIONS, timeout).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let mut response = [0u8; 12];
        stream.read_exact(&mut response).await.unwrap();
        assert_eq!(&response, b"HTTP/1.1 200");
        let idle = Instant::now();
        closed_by_server(&mut stream, "an idle keep-alive connection").await;
        assert!(
            idle.elapsed() >= timeout / 2,
            "closed after {:?}",
            idle.elapsed()
        );
    }
}
