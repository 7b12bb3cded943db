//! Lock-free counters, gauges and histograms, and their Prometheus text rendering.
//!
//! Each process keeps its metrics in one plain struct of these types; the hot paths only do
//! relaxed atomic adds, and the admin listener renders the struct on request.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Relaxed);
    }
    pub fn add(&self, n: i64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Relaxed)
    }
}

/// A gauge that takes fractions (seconds, timestamps).
#[derive(Debug, Default)]
pub struct FloatGauge(AtomicU64);

impl FloatGauge {
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Relaxed);
    }
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Relaxed))
    }
}

/// Counters under one label whose values are known in advance (drop reasons, error kinds).
#[derive(Debug)]
pub struct LabeledCounter {
    labels: &'static [&'static str],
    counts: Box<[Counter]>,
}

impl LabeledCounter {
    pub fn new(labels: &'static [&'static str]) -> Self {
        Self {
            labels,
            counts: labels.iter().map(|_| Counter::default()).collect(),
        }
    }

    /// Adds to the counter of `label`. An unknown label is a programming error.
    pub fn add(&self, label: &str, n: u64) {
        match self.labels.iter().position(|l| *l == label) {
            Some(i) => self.counts[i].add(n),
            None => debug_assert!(false, "unknown metric label {label}"),
        }
    }

    pub fn inc(&self, label: &str) {
        self.add(label, 1);
    }

    pub fn get(&self, label: &str) -> u64 {
        self.labels
            .iter()
            .position(|l| *l == label)
            .map_or(0, |i| self.counts[i].get())
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().map(Counter::get).sum()
    }
}

/// Upper bounds, in seconds, of the latency histogram buckets.
const BOUNDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A latency histogram with fixed buckets from 0.5 ms to 10 s.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [Counter; BOUNDS.len()],
    count: Counter,
    sum_ns: Counter,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BOUNDS.iter().position(|b| secs <= *b) {
            self.buckets[i].inc();
        }
        self.count.inc();
        self.sum_ns
            .add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Observes every duration of `all`, counting locally first: one atomic add per bucket
    /// instead of three per observation, for a batch's worth at once.
    pub fn observe_all(&self, all: impl IntoIterator<Item = Duration>) {
        let mut buckets = [0u64; BOUNDS.len()];
        let (mut count, mut sum_ns) = (0u64, 0u64);
        for d in all {
            let secs = d.as_secs_f64();
            if let Some(i) = BOUNDS.iter().position(|b| secs <= *b) {
                buckets[i] += 1;
            }
            count += 1;
            sum_ns = sum_ns.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        }
        for (bucket, n) in self.buckets.iter().zip(buckets) {
            if n > 0 {
                bucket.add(n);
            }
        }
        self.count.add(count);
        self.sum_ns.add(sum_ns);
    }

    pub fn count(&self) -> u64 {
        self.count.get()
    }
}

/// Prometheus text exposition, version 0.0.4.
#[derive(Debug, Default)]
pub struct Text(String);

impl Text {
    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> &mut Self {
        self.header(name, help, "counter");
        let _ = writeln!(self.0, "{name} {value}");
        self
    }

    pub fn gauge(&mut self, name: &str, help: &str, value: i64) -> &mut Self {
        self.header(name, help, "gauge");
        let _ = writeln!(self.0, "{name} {value}");
        self
    }

    pub fn gauge_f64(&mut self, name: &str, help: &str, value: f64) -> &mut Self {
        self.header(name, help, "gauge");
        let _ = writeln!(self.0, "{name} {value}");
        self
    }

    pub fn labeled(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        c: &LabeledCounter,
    ) -> &mut Self {
        self.header(name, help, "counter");
        for (value, count) in c.labels.iter().zip(c.counts.iter()) {
            let _ = writeln!(self.0, "{name}{{{label}=\"{value}\"}} {}", count.get());
        }
        self
    }

    pub fn histogram(&mut self, name: &str, help: &str, h: &Histogram) -> &mut Self {
        self.header(name, help, "histogram");
        let mut cumulative = 0;
        for (bound, bucket) in BOUNDS.iter().zip(h.buckets.iter()) {
            cumulative += bucket.get();
            let _ = writeln!(self.0, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = h.count.get();
        let sum = h.sum_ns.get() as f64 / 1e9;
        let _ = writeln!(
            self.0,
            "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}"
        );
        self
    }

    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.0)
    }
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

    #[test]
    fn renders_parsable_text() {
        let dropped = LabeledCounter::new(&["ring_full", "shutdown"]);
        dropped.add("ring_full", 3);
        let h = Histogram::default();
        h.observe(Duration::from_millis(2));
        h.observe(Duration::from_secs(60));
        let text = Text::default()
            .counter("x_total", "X.", 5)
            .gauge("depth", "Depth.", -1)
            .gauge_f64("lag_seconds", "Lag.", 0.25)
            .labeled("dropped_total", "Dropped.", "reason", &dropped)
            .histogram("lat_seconds", "Latency.", &h)
            .finish();
        assert_eq!(sample(&text, "x_total"), Some(5.0));
        assert_eq!(sample(&text, "depth"), Some(-1.0));
        assert_eq!(sample(&text, "lag_seconds"), Some(0.25));
        assert_eq!(
            sample(&text, "dropped_total{reason=\"ring_full\"}"),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, "dropped_total{reason=\"shutdown\"}"),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, "lat_seconds_bucket{le=\"0.0025\"}"),
            Some(1.0)
        );
        assert_eq!(sample(&text, "lat_seconds_bucket{le=\"+Inf\"}"), Some(2.0));
        assert_eq!(sample(&text, "lat_seconds_count"), Some(2.0));
        assert!(text.contains("# TYPE lat_seconds histogram"));
        assert_eq!(dropped.total(), 3);
    }

    #[test]
    fn observing_all_at_once_is_observing_each() {
        let (each, all) = (Histogram::default(), Histogram::default());
        let ds = [1, 2, 700, 20_000, 3].map(Duration::from_millis);
        for d in ds {
            each.observe(d);
        }
        all.observe_all(ds);
        let text = |h: &Histogram| Text::default().histogram("h", "H.", h).finish();
        assert_eq!(text(&each), text(&all));
    }
}
