//! Metrics on the `prometheus-client` crate: counters, gauges, histograms and counters under
//! one enum label, each declared once with [`metrics!`](crate::metrics!), and the OpenMetrics
//! text the admin listener serves.
//!
//! Counters, gauges and histograms are atomics: the hot paths only do relaxed adds. A labeled counter
//! resolves every label value once, when created, so counting one is an index and an add;
//! its label values are an enum, so an unknown one does not compile.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelSetEncoder, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::MetricType;
pub use prometheus_client::registry::Registry;

/// A monotonic counter; registered without `_total`, which the encoder appends.
pub type Counter = prometheus_client::metrics::counter::Counter;
/// An integer gauge.
pub type Gauge = prometheus_client::metrics::gauge::Gauge;
/// A gauge that takes fractions (seconds, timestamps).
pub type FloatGauge = prometheus_client::metrics::gauge::Gauge<f64, AtomicU64>;

/// The values of one label, known in advance (drop reasons, error kinds): a fieldless enum.
pub trait Label: Copy + Eq + Hash + Debug + Send + Sync + 'static {
    /// The label's name.
    const NAME: &'static str;
    /// Every value, in the order of [`Label::index`].
    const ALL: &'static [Self];
    /// The position of `self` in [`Label::ALL`].
    fn index(self) -> usize;
    /// The label value exposed.
    fn as_str(self) -> &'static str;
}

/// The reasons a datagram is rejected for are the protocol's, defined there once (it has no
/// metrics dependency); this is their `reason` label.
impl Label for protocol::RejectReason {
    const NAME: &'static str = "reason";
    const ALL: &'static [Self] = &Self::ALL;
    fn index(self) -> usize {
        self as usize
    }
    fn as_str(self) -> &'static str {
        protocol::RejectReason::as_str(self)
    }
}

/// Who followed a link is the protocol's too: the redirector's `agent` label.
impl Label for protocol::dimensions::Agent {
    const NAME: &'static str = "agent";
    const ALL: &'static [Self] = &Self::ALL;
    fn index(self) -> usize {
        self as usize
    }
    fn as_str(self) -> &'static str {
        protocol::dimensions::Agent::as_str(self)
    }
}

/// The label set of a [`LabeledCounter`]: the one label `L::NAME="value"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct One<L>(pub L);

struct Value<L>(L);

impl<L: Label> EncodeLabelValue for Value<L> {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder,
    ) -> std::fmt::Result {
        std::fmt::Write::write_str(encoder, self.0.as_str())
    }
}

impl<L: Label> EncodeLabelSet for One<L> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> std::fmt::Result {
        [(L::NAME, Value(self.0))].encode(encoder)
    }
}

/// Counters under one label whose values are an enum. Every value is created (and exposed,
/// at 0) up front, and its counter kept: counting does not look anything up.
#[derive(Debug)]
pub struct LabeledCounter<L: Label> {
    family: Family<One<L>, Counter>,
    each: Box<[Counter]>,
}

impl<L: Label> Default for LabeledCounter<L> {
    fn default() -> Self {
        let family = Family::<One<L>, Counter>::default();
        let each = L::ALL
            .iter()
            .map(|l| family.get_or_create(&One(*l)).clone())
            .collect();
        Self { family, each }
    }
}

impl<L: Label> LabeledCounter<L> {
    pub fn add(&self, label: L, n: u64) {
        self.each[label.index()].inc_by(n);
    }

    pub fn inc(&self, label: L) {
        self.add(label, 1);
    }

    pub fn get(&self, label: L) -> u64 {
        self.each[label.index()].get()
    }

    pub fn total(&self) -> u64 {
        self.each.iter().map(Counter::get).sum()
    }
}

/// Upper bounds, in seconds, of the latency histogram buckets: up to half an hour, so that a
/// quantile can tell how far behind clicks held through an outage were committed (a
/// quantile stops at the highest bound).
const BOUNDS: [f64; 18] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, 1800.0,
];

/// A latency histogram with fixed buckets from 0.5 ms to 30 min: atomics, where the crate's
/// histogram takes a lock per observation, and [`Histogram::observe_all`] adds many
/// observations at once (the collector observes every click's commit lag, a batch at a time).
#[derive(Debug, Clone, Default)]
pub struct Histogram(Arc<Buckets>);

#[derive(Debug, Default)]
struct Buckets {
    /// Observations per bucket, not cumulative (the encoder adds them up): each at most its
    /// bound in `BOUNDS`, the last above them all.
    counts: [AtomicU64; BOUNDS.len() + 1],
    /// Their sum, in microseconds (a u64 of them wraps after 580,000 years of lag).
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        self.observe_all([d]);
    }

    pub fn observe_all(&self, all: impl IntoIterator<Item = Duration>) {
        let mut counts = [0u64; BOUNDS.len() + 1];
        let mut sum_us = 0u64;
        for d in all {
            let seconds = d.as_secs_f64();
            counts[BOUNDS.partition_point(|&bound| bound < seconds)] += 1;
            sum_us = sum_us.saturating_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        }
        // The sum first: a scrape between the two sees no observation counted without it.
        self.0.sum_us.fetch_add(sum_us, Ordering::Relaxed);
        for (total, n) in self.0.counts.iter().zip(counts) {
            if n > 0 {
                total.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    pub fn count(&self) -> u64 {
        self.0
            .counts
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .sum()
    }
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> std::fmt::Result {
        let counts = self.0.counts.iter().map(|n| n.load(Ordering::Relaxed));
        let bounds = BOUNDS.iter().copied().chain(std::iter::once(f64::MAX));
        let buckets: Vec<(f64, u64)> = bounds.zip(counts).collect();
        let count = buckets.iter().map(|&(_, n)| n).sum();
        let sum = self.0.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// What [`metrics!`](crate::metrics!) registers: a metric, under its name and help.
pub trait Register {
    fn register(&self, registry: &mut Registry, name: &'static str, help: &'static str);
}

fn help(help: &str) -> &str {
    // The encoder appends the period.
    help.strip_suffix('.').unwrap_or(help)
}

impl Register for Counter {
    fn register(&self, registry: &mut Registry, name: &'static str, h: &'static str) {
        registry.register(name, help(h), self.clone());
    }
}

impl Register for Gauge {
    fn register(&self, registry: &mut Registry, name: &'static str, h: &'static str) {
        registry.register(name, help(h), self.clone());
    }
}

impl Register for FloatGauge {
    fn register(&self, registry: &mut Registry, name: &'static str, h: &'static str) {
        registry.register(name, help(h), self.clone());
    }
}

impl Register for Histogram {
    fn register(&self, registry: &mut Registry, name: &'static str, h: &'static str) {
        registry.register(name, help(h), self.clone());
    }
}

impl<L: Label> Register for LabeledCounter<L> {
    fn register(&self, registry: &mut Registry, name: &'static str, h: &'static str) {
        registry.register(name, help(h), self.family.clone());
    }
}

/// The OpenMetrics text of `registry`, `# EOF` included.
///
/// Bucket bounds keep the label values they had in the Prometheus text format (`le="1"`, not
/// the crate's `le="1.0"`): Prometheus before 3.0 stores `le` as written, and dashboards and
/// rules select on it.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)
        .expect("writing to a String does not fail");
    if !text.contains(".0\"}") {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        match line.split_once("_bucket{le=\"") {
            Some((name, rest)) if !line.starts_with('#') => match rest.split_once(".0\"}") {
                Some((whole, tail)) if whole.bytes().all(|b| b.is_ascii_digit()) => {
                    out.push_str(name);
                    out.push_str("_bucket{le=\"");
                    out.push_str(whole);
                    out.push_str("\"}");
                    out.push_str(tail);
                }
                _ => out.push_str(line),
            },
            _ => out.push_str(line),
        }
    }
    out
}

/// The content type of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A registry for one component's metrics within `parent`: the parent's prefix and no label of
/// its own, so that the names a component registers are what they would be in the parent.
pub fn sub_registry(parent: &mut Registry) -> &mut Registry {
    parent.sub_registry_with_labels(std::iter::empty())
}

/// Declares metrics once each: the struct's field, its type, its exposed name (counters
/// without `_total`) and its help.
///
/// With `prefix`, a process's metrics in a registry of their own: `Default` creates and
/// registers them all under the prefix; `encode` renders them. Without, one component's
/// metrics: `register` creates them and registers them into a registry it is given (a
/// [`sub_registry`] of the process's), and `Default` creates them unregistered (for tests).
#[macro_export]
macro_rules! metrics {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident, prefix $prefix:literal {
            $( $(#[$fmeta:meta])* $field:ident: $ty:ty = $metric:literal, $help:literal; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug)]
        $vis struct $name {
            $( $(#[$fmeta])* $vis $field: $ty, )*
            registry: $crate::metrics::Registry,
        }

        impl Default for $name {
            fn default() -> Self {
                let mut registry = $crate::metrics::Registry::with_prefix($prefix);
                $(
                    let $field = <$ty>::default();
                    $crate::metrics::Register::register(&$field, &mut registry, $metric, $help);
                )*
                Self { $($field,)* registry }
            }
        }

        impl $name {
            /// The OpenMetrics exposition of every metric.
            $vis fn encode(&self) -> String {
                $crate::metrics::encode(&self.registry)
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident: $ty:ty = $metric:literal, $help:literal; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $( $(#[$fmeta])* $vis $field: $ty, )*
        }

        impl $name {
            /// Creates the metrics, registered into `registry`.
            $vis fn register(registry: &mut $crate::metrics::Registry) -> Self {
                let metrics = Self::default();
                $(
                    $crate::metrics::Register::register(
                        &metrics.$field, registry, $metric, $help,
                    );
                )*
                metrics
            }
        }
    };
}

/// Declares a fieldless enum of label values and its [`Label`] impl: the label's name, and
/// each variant's exposed value.
#[macro_export]
macro_rules! label {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident: $label:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )*
        }

        impl $crate::metrics::Label for $name {
            const NAME: &'static str = $label;
            const ALL: &'static [Self] = &[$(Self::$variant),*];
            fn index(self) -> usize {
                self as usize
            }
            fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $value,)*
                }
            }
        }
    };
}

/// Reads one sample (`name` or `name{labels}`) out of a rendered exposition; for tests and
/// tools that scrape `/metrics`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::label! {
        pub enum Reason: "reason" {
            RingFull = "ring_full",
            Shutdown = "shutdown",
        }
    }

    crate::metrics! {
        pub struct Test, prefix "t" {
            x: Counter = "x", "X.";
            depth: Gauge = "depth", "Depth.";
            lag: FloatGauge = "lag_seconds", "Lag.";
            dropped: LabeledCounter<Reason> = "dropped", "Dropped.";
            lat: Histogram = "lat_seconds", "Latency.";
        }
    }

    crate::metrics! {
        pub struct Part {
            y: Counter = "y", "Y.";
        }
    }

    #[test]
    fn a_component_registers_into_a_sub_registry_under_the_parents_prefix() {
        let mut registry = Registry::with_prefix("t");
        let part = Part::register(sub_registry(&mut registry));
        part.y.inc();
        let text = encode(&registry);
        assert_eq!(sample(&text, "t_y_total"), Some(1.0), "{text}");
        assert!(text.contains("# HELP t_y Y.\n"), "{text}");
        Part::default().y.inc();
        assert_eq!(sample(&encode(&registry), "t_y_total"), Some(1.0));
    }

    #[test]
    fn a_histogram_takes_many_observations_at_once_each_in_its_bucket() {
        let m = Test::default();
        let ms = |n: u64| Duration::from_micros(n * 1_000);
        // On a bound (1 ms) is within it; just past it is in the next.
        m.lat
            .observe_all([ms(1), Duration::from_micros(1_001), ms(3), ms(3)]);
        m.lat.observe(ms(20_000));
        m.lat.observe_all([ms(120_000), ms(3_600_000)]);
        let text = m.encode();
        let bucket = |le: &str| sample(&text, &format!("t_lat_seconds_bucket{{le=\"{le}\"}}"));
        assert_eq!(bucket("0.0005"), Some(0.0), "{text}");
        assert_eq!(bucket("0.001"), Some(1.0), "{text}");
        assert_eq!(bucket("0.0025"), Some(2.0), "{text}");
        assert_eq!(bucket("0.005"), Some(4.0), "{text}");
        assert_eq!(bucket("10"), Some(4.0), "{text}");
        assert_eq!(bucket("30"), Some(5.0), "{text}");
        assert_eq!(bucket("60"), Some(5.0), "{text}");
        assert_eq!(
            bucket("300"),
            Some(6.0),
            "an outage's lag is told apart: {text}"
        );
        assert_eq!(bucket("1800"), Some(6.0), "{text}");
        assert_eq!(bucket("+Inf"), Some(7.0), "{text}");
        assert_eq!(sample(&text, "t_lat_seconds_count"), Some(7.0));
        assert_eq!(sample(&text, "t_lat_seconds_sum"), Some(3740.008001));
        assert_eq!(m.lat.count(), 7);
    }

    #[test]
    fn renders_parsable_openmetrics() {
        let m = Test::default();
        m.x.inc_by(5);
        m.depth.set(-1);
        m.lag.set(0.25);
        m.dropped.add(Reason::RingFull, 3);
        m.lat.observe(Duration::from_millis(2));
        m.lat.observe_all([Duration::from_secs(60)]);
        let text = m.encode();
        assert_eq!(sample(&text, "t_x_total"), Some(5.0));
        assert_eq!(sample(&text, "t_depth"), Some(-1.0));
        assert_eq!(sample(&text, "t_lag_seconds"), Some(0.25));
        assert_eq!(
            sample(&text, "t_dropped_total{reason=\"ring_full\"}"),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, "t_dropped_total{reason=\"shutdown\"}"),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, "t_lat_seconds_bucket{le=\"0.0025\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "t_lat_seconds_bucket{le=\"+Inf\"}"),
            Some(2.0)
        );
        assert_eq!(sample(&text, "t_lat_seconds_count"), Some(2.0));
        assert!(text.contains("# TYPE t_lat_seconds histogram"), "{text}");
        assert!(text.contains("# TYPE t_x counter"), "{text}");
        assert!(text.contains("# HELP t_x X.\n"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(sample(&text, "t_lat_seconds_bucket{le=\"1\"}"), Some(1.0));
        assert_eq!(sample(&text, "t_lat_seconds_bucket{le=\"10\"}"), Some(1.0));
        assert_eq!(sample(&text, "t_lat_seconds_bucket{le=\"0.5\"}"), Some(1.0));
        assert!(!text.contains("le=\"1.0\""), "{text}");
        assert_eq!(m.dropped.total(), 3);
        assert_eq!(m.lat.count(), 2);
    }
}
