//! The redirect server: `GET /{code}` answers the link's redirect (302 unless the link says
//! 301, 307 or 308) from the link table and records the click; `HEAD` answers the same without recording. Connections are served by hyper's HTTP/1
//! server with a header read timeout and a bounded buffer (so a bounded request line), within
//! the bounds of `bounded` (how many, how long idle) and `watched` (how long a response may
//! wait for its client), and shut down gracefully.

mod bounded;
mod visitor;
mod watched;

pub(crate) use bounded::connection_limit;

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CACHE_CONTROL, LOCATION, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::direct::Direct;
use crate::links::{LinkTable, Lookup};
use crate::metrics::{Closed, Common, Dropped};
use crate::ring::{PushError, Ring};
use crate::target::Answer;
use bounded::{Conn, Connections};
use protocol::dimensions::{Agent, Dimensions, MAX_REFERRER_LEN};
use shared::metrics::{Counter, Gauge, LabeledCounter};
pub(crate) use visitor::Classifier;
use watched::Watched;

shared::metrics! {
    /// What serving redirects counts: requests by answer, client connections.
    pub struct Metrics {
        /// Each one is a click, sent or dropped.
        redirects: Counter = "redirects", "GET requests redirected (each one a click).";
        redirects_by_agent: LabeledCounter<Agent> = "redirects_by_agent",
            "GET requests redirected, by who the redirector took the client for (human, bot, preview).";
        head_redirects: Counter = "head_redirects", "HEAD requests redirected (not clicks).";
        expired: Counter = "expired", "Requests for a link past its expires_at (410; not clicks).";
        query_not_forwarded: Counter = "query_not_forwarded",
            "Redirects whose request query was not forwarded: it would add more than 2 KiB to Location.";
        country_invalid: Counter = "country_invalid",
            "Country headers that held no assigned ISO 3166 alpha-2 code (the country left out).";
        country_missing: Counter = "country_missing",
            "Clicks recorded with the country whose request had no --country-header (the country left out).";
        not_found: Counter = "not_found", "Requests for an unknown or malformed code (404).";
        method_not_allowed: Counter = "method_not_allowed",
            "Methods other than GET or HEAD (405).";
        not_ready: Counter = "not_ready", "Answered 503 before the first link table load.";
        connections: Gauge = "connections", "Client connections open.";
        connections_limit: Gauge = "connections_limit",
            "Client connections allowed at once (--max-connections, fitted under the descriptor limit).";
        connections_closed: LabeledCounter<Closed> = "connections_closed",
            "Client connections the server closed itself, by reason.";
        accept_errors: Counter = "accept_errors",
            "Failed accepts of client connections (out of descriptors, typically).";
    }
}

/// The request line and headers together, at most (hyper's read buffer; at least 8 KiB). A
/// browser's request carries every cookie of the shortener's domain and its parents: a
/// shortener on a subdomain of a site with analytics and consent cookies gets heads of 6-10
/// KB, which 8 KiB, hyper's least, refused with a 431. Larger heads are refused so
/// (`redirector_connections_closed_total{reason="head_too_large"}`).
const MAX_HEAD: usize = 16 * 1024;

/// What happens to a click once its redirect is decided.
pub(crate) enum Clicks {
    /// Pushed into the ring for the drain task (the product).
    Pipeline(Arc<Ring>),
    /// Not recorded (the baseline without click work).
    Off,
    /// One INSERT per click, awaited inside the request (the slow baseline).
    Direct(Arc<Direct>),
}

/// What a request handler needs.
pub(crate) struct App {
    pub links: Arc<LinkTable>,
    pub classifier: Classifier,
    pub clicks: Clicks,
    pub metrics: Arc<Metrics>,
    pub common: Arc<Common>,
}

type Body = Full<Bytes>;

impl App {
    async fn answer(&self, req: &Request<Incoming>) -> Response<Body> {
        let counted = match *req.method() {
            Method::GET => true,
            Method::HEAD => false,
            _ => {
                self.metrics.method_not_allowed.inc();
                let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD only\n");
                let allowed = HeaderValue::from_static("GET, HEAD");
                response.headers_mut().insert(ALLOW, allowed);
                return response;
            }
        };
        let code = req.uri().path().strip_prefix('/').unwrap_or_default();
        let lookup = match protocol::wire::validate_code(code.as_bytes()) {
            Ok(()) => self.links.lookup(code, req.uri().query()),
            Err(_) => Lookup::Unknown,
        };
        let (status, location, expires_in_s) = match lookup {
            Lookup::Found(Answer::Redirect {
                status,
                location,
                expires_in_s,
                query_dropped,
            }) => {
                if query_dropped {
                    self.metrics.query_not_forwarded.inc();
                }
                (status, location, expires_in_s)
            }
            Lookup::Found(Answer::Expired) => {
                self.metrics.expired.inc();
                let mut response = plain(StatusCode::GONE, "this link has expired\n");
                response.headers_mut().insert(CACHE_CONTROL, NO_STORE);
                return response;
            }
            // Neither kept by a cache in front (a CDN may keep a 404 by default): the code may
            // be a link a moment later.
            Lookup::Unknown => {
                self.metrics.not_found.inc();
                let mut response = plain(StatusCode::NOT_FOUND, "no such link\n");
                response.headers_mut().insert(CACHE_CONTROL, NO_STORE);
                return response;
            }
            Lookup::NotLoaded => {
                self.metrics.not_ready.inc();
                let mut response = plain(StatusCode::SERVICE_UNAVAILABLE, "starting\n");
                let headers = response.headers_mut();
                headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
                headers.insert(CACHE_CONTROL, NO_STORE);
                return response;
            }
        };
        if counted && !matches!(self.clicks, Clicks::Off) {
            let mut referrer = [0; MAX_REFERRER_LEN];
            let classified = self.classifier.classify(req.headers(), &mut referrer);
            if classified.country_rejected {
                self.metrics.country_invalid.inc();
            }
            if classified.country_missing {
                self.metrics.country_missing.inc();
            }
            self.record(code, &classified.dimensions).await;
        } else if counted {
            self.metrics.redirects.inc();
        } else {
            self.metrics.head_redirects.inc();
        }
        let mut response = Response::new(Body::default());
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(LOCATION, location);
        headers.insert(CACHE_CONTROL, cache_control(status, expires_in_s));
        response
    }

    /// Records the click and counts the redirect, in one step that a request cut off midway
    /// (its client gone, or the stop) cannot split: every redirect counted is a click recorded
    /// or dropped, and every click recorded is a redirect counted.
    async fn record(&self, code: &str, dimensions: &Dimensions<'_>) {
        let m = &self.metrics;
        m.redirects_by_agent.inc(dimensions.agent);
        match &self.clicks {
            Clicks::Pipeline(ring) => {
                // Queued clicks are counted by the ring (`Ring::pushed`).
                match ring.push(code, protocol::now_us(), dimensions) {
                    Ok(()) => {}
                    Err(PushError::Full) => self.common.clicks_dropped.inc(Dropped::RingFull),
                    Err(PushError::CodeTooLong | PushError::ReferrerTooLong) => {
                        self.common.clicks_dropped.inc(Dropped::Invalid)
                    }
                }
                m.redirects.inc();
            }
            // Not classified, nor recorded: counted where `answer` decides so.
            Clicks::Off => {
                m.redirects.inc();
            }
            Clicks::Direct(direct) => direct.record(code, &m.redirects, &self.common).await,
        }
    }
}

const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

/// How long a browser may keep a permanent redirect (301, 308), at most.
const PERMANENT_MAX_AGE_S: i64 = 3600;

/// A temporary redirect is never cached, so that every click reaches the redirector. A
/// permanent one (301, 308) says it may be: browsers then follow it from their cache for an
/// hour, and those clicks are never counted (docs/links-and-clicks.md says so); for a link that
/// expires sooner, until it expires, so that no browser follows it past its expiry.
fn cache_control(status: StatusCode, expires_in_s: Option<i64>) -> HeaderValue {
    let permanent = matches!(
        status,
        StatusCode::MOVED_PERMANENTLY | StatusCode::PERMANENT_REDIRECT
    );
    match expires_in_s {
        _ if !permanent => NO_STORE,
        Some(left) if left < PERMANENT_MAX_AGE_S => {
            let age = left.max(0);
            HeaderValue::from_str(&format!("private, max-age={age}")).unwrap_or(NO_STORE)
        }
        _ => HeaderValue::from_static("private, max-age=3600"),
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response
}

/// How connections are served.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// A client that has not sent its whole request head by then is disconnected.
    pub header_read_timeout: Duration,
    /// At shutdown, how long requests in flight get to finish.
    pub grace: Duration,
    /// Connections open at once (already fitted under the descriptor limit).
    pub max_connections: usize,
    /// A connection idle between requests this long is closed.
    pub idle_timeout: Duration,
    /// A response the client leaves untaken this long closes its connection.
    pub write_timeout: Duration,
}

/// Waits after a failed accept: the first short (a burst of clients), doubling to a cap that
/// still lets closing connections give their descriptors back quickly, never a busy loop.
const ACCEPT_RETRY_FIRST: Duration = Duration::from_millis(5);
const ACCEPT_RETRY_CAP: Duration = Duration::from_millis(500);

/// Serves `listener` until `shutdown` resolves, then stops accepting, lets requests in flight
/// finish (for up to `limits.grace`) and closes every connection. When it returns, no handler
/// is running or will run again, so click counts taken after it are final; so too when a
/// defect in the accept loop panics: every connection's task is aborted and waited for
/// before the panic goes on, as dropping the set would only tell each to end, and one
/// mid-poll could still push a click after the drain's last send.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let accepting = accept(
        listener,
        app,
        limits,
        (&graceful, &mut connections),
        shutdown,
    );
    let accepted = AssertUnwindSafe(accepting).catch_unwind().await;
    if accepted.is_ok()
        && tokio::time::timeout(limits.grace, graceful.shutdown())
            .await
            .is_err()
    {
        tracing::warn!(
            "{} connections still open after {:?}; closing them",
            connections.len(),
            limits.grace
        );
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
    if let Err(panic) = accepted {
        std::panic::resume_unwind(panic);
    }
}

/// Accepts connections into `connections`, each watched by `graceful`, until `shutdown`.
async fn accept(
    listener: TcpListener,
    app: Arc<App>,
    limits: Limits,
    (graceful, connections): (&GracefulShutdown, &mut JoinSet<()>),
    shutdown: impl Future<Output = ()>,
) {
    let open = Connections::new(limits.max_connections, app.metrics.clone());
    let mut retry = shared::backoff::Backoff::new(ACCEPT_RETRY_FIRST, ACCEPT_RETRY_CAP);
    let mut accept_log = shared::throttle::Throttle::default();
    // A connection's task ends once its descriptor is closed.
    let tasks_at_most = bounded::open_or_closing(limits.max_connections);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept(), if connections.len() < tasks_at_most => match accepted {
                Ok((stream, _)) => {
                    retry.reset();
                    // Refused (and counted) when every connection is busy: dropping closes it.
                    let Some(held) = open.admit() else { continue };
                    let _ = stream.set_nodelay(true);
                    let conn = held.conn().clone();
                    let io = Watched::new(stream, conn.clone(), limits.write_timeout);
                    let connection = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(limits.header_read_timeout)
                        .max_buf_size(MAX_HEAD)
                        .serve_connection(TokioIo::new(io), service(app.clone(), conn));
                    let watched = graceful.watch(connection);
                    connections.spawn(bounded::drive(watched, held, limits.idle_timeout));
                }
                Err(e) => {
                    app.metrics.accept_errors.inc();
                    // Out of descriptors: the connection idle the longest gives its own back.
                    let evicted = out_of_descriptors(&e) && open.evict_one();
                    if let Some(held_back) = accept_log.allow() {
                        tracing::warn!(
                            "http accept: {e}{}; {held_back} more since the last line",
                            if evicted { " (closed the connection idle the longest, or the slowest head)" } else { "" }
                        );
                    }
                    retry.wait().await;
                }
            },
        }
    }
}

fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(code) if code == nix::libc::EMFILE || code == nix::libc::ENFILE)
}

/// The handler of one connection's requests; each marks the connection busy while it runs.
fn service(
    app: Arc<App>,
    conn: Arc<Conn>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(move |req: Request<Incoming>| {
        let app = app.clone();
        let answering = conn.begin_request();
        async move {
            let response = app.answer(&req).await;
            drop(answering);
            Ok::<_, Infallible>(response)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::wire::MAX_CODE_LEN;

    const HUMAN: Dimensions<'static> = Dimensions {
        agent: Agent::Human,
        referrer: None,
        device: None,
        country: None,
    };

    fn pipeline(capacity: usize) -> (App, Arc<Ring>) {
        let ring = crate::state::Region::in_process(capacity as u64, 1)
            .unwrap()
            .ring;
        let app = App {
            links: Arc::new(LinkTable::default()),
            classifier: Classifier::new(Default::default(), None),
            clicks: Clicks::Pipeline(ring.clone()),
            metrics: Arc::new(Metrics::default()),
            common: Arc::new(Common::default()),
        };
        (app, ring)
    }

    #[tokio::test]
    async fn a_code_the_ring_refuses_as_too_long_is_invalid_not_ring_full() {
        let (app, ring) = pipeline(4);
        app.record(&"x".repeat(MAX_CODE_LEN + 1), &HUMAN).await;
        assert_eq!(app.common.clicks_dropped.get(Dropped::Invalid), 1);
        assert_eq!(app.common.clicks_dropped.get(Dropped::RingFull), 0);
        assert!(ring.is_empty());
    }

    /// Once the server has ended, by its stop or by a panic in its accept loop, no connection's task is left to run a
    /// handler: here the accept loop panics with a keep-alive connection open, and by the
    /// time the panic reaches the caller, nothing but the caller holds the handlers' `App`.
    #[tokio::test]
    async fn a_panic_in_the_accept_loop_ends_every_connection_before_it_goes_on() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let app = Arc::new(pipeline(4).0);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            header_read_timeout: Duration::from_secs(60),
            grace: Duration::from_secs(60),
            max_connections: 4,
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(60),
        };
        let (fail, failing) = tokio::sync::oneshot::channel::<()>();
        let defect = async {
            let _ = failing.await;
            panic!("a defect in the accept loop");
        };
        let serving = AssertUnwindSafe(serve(listener, app.clone(), limits, defect)).catch_unwind();
        let client = async {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream
                .write_all(b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n")
                .await
                .unwrap();
            let mut head = [0u8; 9];
            stream.read_exact(&mut head).await.unwrap();
            assert_eq!(&head, b"HTTP/1.1 ", "the connection's handler answered");
            fail.send(()).unwrap();
            stream
        };
        let served = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::join!(serving, client)
        });
        let (served, _open) = served.await.expect("the server ends within 30 s");
        assert!(
            served.is_err(),
            "the accept loop's panic goes on to the caller"
        );
        assert_eq!(
            Arc::strong_count(&app),
            1,
            "a connection's task, and its handler, outlived the server"
        );
    }

    #[tokio::test]
    async fn a_click_the_full_ring_refuses_is_ring_full() {
        let (app, ring) = pipeline(1);
        app.record("a", &HUMAN).await;
        app.record("b", &HUMAN).await;
        assert_eq!(ring.pushed(), 1);
        assert_eq!(app.common.clicks_dropped.get(Dropped::RingFull), 1);
        assert_eq!(app.common.clicks_dropped.get(Dropped::Invalid), 0);
    }
}
