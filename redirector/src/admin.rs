//! What the admin listener serves: the metrics, with the gauges read from the ring when
//! `/metrics` is asked for, and health judged from the link table. Apart from `metrics`, so
//! that the components counting into `Metrics` (the link loader among them) and the view of
//! them do not import each other.

use std::sync::Arc;

use crate::links::LinkTable;
use crate::metrics::Metrics;
use crate::ring::Ring;

/// What `/metrics` and `/healthz` read: the metrics, and the state health is judged by.
pub(crate) struct AdminView {
    pub metrics: Arc<Metrics>,
    pub ring: Option<Arc<Ring>>,
    pub links: Arc<LinkTable>,
}

impl shared::admin::Admin for AdminView {
    fn metrics(&self) -> String {
        let m = &self.metrics;
        let (depth, capacity) = self
            .ring
            .as_ref()
            .map_or((0, 0), |r| (r.len() as i64, r.capacity() as i64));
        m.ring_depth.set(depth);
        m.ring_capacity.set(capacity);
        m.encode()
    }

    fn connection_closed(&self, why: shared::admin::Closed) {
        self.metrics.admin_connections_closed.inc(why);
    }

    fn health(&self) -> Result<(), String> {
        if self.links.is_loaded() {
            Ok(())
        } else {
            Err("link table not loaded yet".into())
        }
    }
}
