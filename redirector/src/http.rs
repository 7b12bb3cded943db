//! The redirect server: `GET /{code}` answers `302 Found` from the link table and records the
//! click; `HEAD` answers the same without recording. Connections are served by hyper's HTTP/1
//! server with a header read timeout and a bounded buffer (so a bounded request line), and
//! shut down gracefully.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CACHE_CONTROL, LOCATION, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::direct::Direct;
use crate::links::{LinkTable, Lookup};
use crate::metrics::{reason, Metrics};
use crate::ring::{Refusal, Ring};

/// hyper's smallest allowed read buffer; it bounds the request line and headers together.
const MAX_HEAD: usize = 8192;

/// What happens to a click once its redirect is decided.
pub enum Clicks {
    /// Pushed into the ring for the drain task (the product).
    Pipeline(Arc<Ring>),
    /// Not recorded (the baseline without click work).
    Off,
    /// One INSERT per click, awaited inside the request (the slow baseline).
    Direct(Arc<Direct>),
}

/// What a request handler needs.
pub struct App {
    pub links: Arc<LinkTable>,
    pub clicks: Clicks,
    pub metrics: Arc<Metrics>,
}

type Body = Full<Bytes>;

impl App {
    async fn answer(&self, req: &Request<Incoming>) -> Response<Body> {
        let counted = match *req.method() {
            Method::GET => true,
            Method::HEAD => false,
            _ => {
                self.metrics.method_not_allowed.inc();
                return plain(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD only\n");
            }
        };
        let code = req.uri().path().strip_prefix('/').unwrap_or_default();
        let lookup = match shared::wire::validate_code(code.as_bytes()) {
            Ok(()) => self.links.lookup(code),
            Err(_) => Lookup::Unknown,
        };
        let location = match lookup {
            Lookup::Found(location) => location,
            Lookup::Unknown => {
                self.metrics.not_found.inc();
                return plain(StatusCode::NOT_FOUND, "no such link\n");
            }
            Lookup::NotLoaded => {
                self.metrics.not_ready.inc();
                let mut response = plain(StatusCode::SERVICE_UNAVAILABLE, "starting\n");
                response
                    .headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from_static("1"));
                return response;
            }
        };
        if counted {
            self.record(code).await;
        } else {
            self.metrics.head_redirects.inc();
        }
        let mut response = Response::new(Body::default());
        *response.status_mut() = StatusCode::FOUND;
        let headers = response.headers_mut();
        headers.insert(LOCATION, location);
        // A cached redirect would hide the next click from us.
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }

    /// Records the click and counts the redirect, in one step that a request cut off midway
    /// (its client gone, or the stop) cannot split: every redirect counted is a click recorded
    /// or dropped, and every click recorded is a redirect counted.
    async fn record(&self, code: &str) {
        let m = &self.metrics;
        match &self.clicks {
            Clicks::Pipeline(ring) => {
                match ring.push(code, shared::now_us()) {
                    Ok(()) => m.clicks_queued.inc(),
                    Err(Refusal::Full) => m.clicks_dropped.inc(reason::RING_FULL),
                    Err(Refusal::CodeTooLong) => m.clicks_dropped.inc(reason::INVALID),
                }
                m.redirects.inc();
            }
            Clicks::Off => m.redirects.inc(),
            Clicks::Direct(direct) => direct.record(code, m).await,
        }
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response
}

/// How connections are served.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A client that has not sent its whole request head by then is disconnected.
    pub header_read_timeout: Duration,
    /// At shutdown, how long requests in flight get to finish.
    pub grace: Duration,
}

/// Serves `listener` until `shutdown` resolves, then stops accepting, lets requests in flight
/// finish (for up to `limits.grace`) and closes every connection. When it returns, no handler
/// is running or will run again, so click counts taken after it are final.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let connection = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(limits.header_read_timeout)
                        .max_buf_size(MAX_HEAD)
                        .serve_connection(TokioIo::new(stream), service(app.clone()));
                    let watched = graceful.watch(connection);
                    connections.spawn(async move {
                        if let Err(e) = watched.await {
                            tracing::debug!("http connection: {e}");
                        }
                    });
                }
                Err(e) => {
                    // Out of file descriptors, typically: give connections time to close.
                    tracing::warn!("http accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    if tokio::time::timeout(limits.grace, graceful.shutdown())
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
}

fn service(
    app: Arc<App>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(move |req: Request<Incoming>| {
        let app = app.clone();
        async move { Ok::<_, Infallible>(app.answer(&req).await) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::wire::MAX_CODE_LEN;

    fn pipeline(capacity: usize) -> (App, Arc<Ring>) {
        let ring = Arc::new(Ring::new(capacity));
        let app = App {
            links: Arc::new(LinkTable::default()),
            clicks: Clicks::Pipeline(ring.clone()),
            metrics: Arc::new(Metrics::default()),
        };
        (app, ring)
    }

    #[tokio::test]
    async fn a_code_the_ring_refuses_as_too_long_is_invalid_not_ring_full() {
        let (app, ring) = pipeline(4);
        app.record(&"x".repeat(MAX_CODE_LEN + 1)).await;
        assert_eq!(app.metrics.clicks_dropped.get(reason::INVALID), 1);
        assert_eq!(app.metrics.clicks_dropped.get(reason::RING_FULL), 0);
        assert!(ring.is_empty());
    }

    #[tokio::test]
    async fn a_click_the_full_ring_refuses_is_ring_full() {
        let (app, _ring) = pipeline(1);
        app.record("a").await;
        app.record("b").await;
        assert_eq!(app.metrics.clicks_queued.get(), 1);
        assert_eq!(app.metrics.clicks_dropped.get(reason::RING_FULL), 1);
        assert_eq!(app.metrics.clicks_dropped.get(reason::INVALID), 0);
    }
}
