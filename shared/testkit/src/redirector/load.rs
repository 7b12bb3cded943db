//! A small HTTP load generator for the tests: N tasks, each with its own keep-alive HTTP/1
//! connection (hyper's client conn over a TcpStream), sharing one request budget.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

/// What the clients saw.
#[derive(Debug, Default)]
pub struct Report {
    pub statuses: BTreeMap<u16, u64>,
    /// Requests that got no answer (the connection failed or closed); each ends its task,
    /// unless the load reconnects.
    pub errors: u64,
    pub max_latency: Duration,
}

impl Report {
    pub fn count(&self, status: u16) -> u64 {
        self.statuses.get(&status).copied().unwrap_or(0)
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
    }
}

/// One load run: `method path` on `connections` connections until `requests` were made or
/// `stop` is set, whichever comes first.
#[derive(Clone)]
pub struct Load {
    pub addr: SocketAddr,
    pub method: Method,
    pub path: String,
    pub connections: usize,
    pub stop: Arc<AtomicBool>,
    /// After a request that got no answer, connect again (after 10 ms) and go on, as clients
    /// of a server that restarts do; without it the connection's task ends.
    pub reconnect: bool,
}

impl Load {
    pub fn get(addr: SocketAddr, path: &str) -> Load {
        Load {
            addr,
            method: Method::GET,
            path: path.to_owned(),
            connections: 50,
            stop: Arc::new(AtomicBool::new(false)),
            reconnect: false,
        }
    }

    pub fn method(mut self, method: Method) -> Load {
        self.method = method;
        self
    }

    /// Makes `requests` requests (fewer if stopped or if connections fail).
    pub async fn run(&self, requests: u64) -> Report {
        let budget = Arc::new(AtomicU64::new(requests));
        let tasks: Vec<_> = (0..self.connections)
            .map(|_| tokio::spawn(self.clone().connection(budget.clone())))
            .collect();
        let mut report = Report::default();
        for task in tasks {
            report.merge(task.await.expect("load task"));
        }
        report
    }

    /// Runs until [`Load::stop`] is set; returns the task that gives the report.
    pub fn start(&self) -> tokio::task::JoinHandle<Report> {
        let load = self.clone();
        tokio::spawn(async move { load.run(u64::MAX).await })
    }

    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
    }

    async fn connection(self, budget: Arc<AtomicU64>) -> Report {
        let mut report = Report::default();
        loop {
            let cut_off = report.errors;
            self.connect_and_request(&budget, &mut report).await;
            if !self.reconnect || report.errors == cut_off || self.stop.load(Relaxed) {
                return report;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// One connection's requests, until one gets no answer, the budget is spent or `stop`.
    async fn connect_and_request(&self, budget: &AtomicU64, report: &mut Report) {
        let Ok(stream) = tokio::net::TcpStream::connect(self.addr).await else {
            report.errors += 1;
            return;
        };
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) =
            match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
                Ok(pair) => pair,
                Err(_) => {
                    report.errors += 1;
                    return;
                }
            };
        tokio::spawn(connection);
        while !self.stop.load(Relaxed)
            && budget
                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                .is_ok()
        {
            let request = Request::builder()
                .method(self.method.clone())
                .uri(self.path.as_str())
                .header(hyper::header::HOST, "load")
                .body(Empty::<Bytes>::new())
                .expect("valid request");
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
            report.max_latency = report.max_latency.max(start.elapsed());
            *report.statuses.entry(status).or_default() += 1;
        }
    }
}
