//! What the admin listener serves: every component's metrics (the registry they registered
//! into), with the gauges and the queued clicks read from the ring when `/metrics` is asked
//! for, and health judged from the link table. Apart from `metrics`, so that the components
//! counting into `Common` (the link loader among them) and the view of them do not import
//! each other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use shared::metrics::Registry;

use crate::links::LinkTable;
use crate::metrics::Common;
use crate::ring::Ring;

/// What `/metrics` and `/healthz` read: the metrics, and the state health is judged by.
pub(crate) struct AdminView {
    pub registry: Registry,
    pub common: Arc<Common>,
    pub ring: Option<Arc<Ring>>,
    pub links: Arc<LinkTable>,
    /// Set when the stop begins: the listener is closed then, and a load balancer or a
    /// readiness probe asking `/healthz` must stop sending clients here.
    pub stopping: Arc<AtomicBool>,
}

impl shared::admin::Admin for AdminView {
    fn metrics(&self) -> String {
        let m = &self.common;
        let (pushed, depth, capacity) = self.ring.as_ref().map_or((0, 0, 0), |r| {
            (r.pushed(), r.len() as i64, r.capacity() as i64)
        });
        // `fetch_max`, as scrapes may run at once: the counter rises to what the ring says.
        m.clicks_queued.inner().fetch_max(pushed, Ordering::Relaxed);
        m.ring_depth.set(depth);
        m.ring_capacity.set(capacity);
        shared::metrics::encode(&self.registry)
    }

    fn connection_closed(&self, why: shared::admin::Closed) {
        self.common.admin_connections_closed.inc(why);
    }

    fn health(&self) -> Result<(), String> {
        if self.stopping.load(Ordering::Relaxed) {
            Err("stopping".into())
        } else if self.links.is_loaded() {
            Ok(())
        } else {
            Err("link table not loaded yet".into())
        }
    }
}
