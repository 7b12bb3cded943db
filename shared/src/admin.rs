//! The admin listener each process runs beside its real work: `GET /metrics` (OpenMetrics
//! text) and `GET /healthz` (200 once ready, 503 before).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// How long a scraper may take to send its request head.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
const ACCEPT_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// What a process exposes on its admin listener.
pub trait Admin: Send + Sync + 'static {
    /// The whole OpenMetrics exposition, `# EOF` included.
    fn metrics(&self) -> String;
    /// Whether the process is doing its job (`/healthz` says 200), and if not, why.
    fn health(&self) -> Result<(), String>;
}

/// Serves the admin endpoints on `listener` until the task is aborted or the process exits.
pub fn spawn(listener: TcpListener, admin: Arc<dyn Admin>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, typically: pause instead of spinning on it.
                    tracing::warn!("admin accept: {e}");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            };
            let admin = admin.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let admin = admin.clone();
                    async move { Ok::<_, Infallible>(answer(&*admin, &req)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
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
        return reply(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
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
    use crate::testkit::http::get;

    struct Fixed(bool);

    impl Admin for Fixed {
        fn metrics(&self) -> String {
            "up 1\n".into()
        }
        fn health(&self) -> Result<(), String> {
            if self.0 {
                Ok(())
            } else {
                Err("database not reached".into())
            }
        }
    }

    async fn serve(ready: bool) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        spawn(listener, Arc::new(Fixed(ready)));
        addr
    }

    #[tokio::test]
    async fn serves_metrics_and_health() {
        let addr = serve(true).await;
        assert_eq!(get(addr, "/metrics").await.unwrap(), (200, "up 1\n".into()));
        assert_eq!(get(addr, "/healthz").await.unwrap(), (200, "ok\n".into()));
        assert_eq!(get(addr, "/nope").await.unwrap().0, 404);
    }

    #[tokio::test]
    async fn health_says_why_it_is_not_ready() {
        let addr = serve(false).await;
        let (status, body) = get(addr, "/healthz").await.unwrap();
        assert_eq!(status, 503);
        assert!(body.contains("database not reached"), "{body}");
    }
}
