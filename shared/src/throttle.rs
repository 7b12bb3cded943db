//! Log lines about something that can happen thousands of times a second (a rejected
//! datagram, a failed send) or on every retry of an outage are let through at most once per
//! period, each saying how many were held back since the last one. One helper for every such
//! line, so that they all read alike and none floods the log.
//!
//! A *run* is a series of like events: its first is always let through; then one per period
//! (or, for [`Throttle::per_outage`], none until the run ends). [`Throttle::end`] closes a run,
//! saying how long it lasted, so that the caller can log the recovery.

use std::time::Duration;

use tokio::time::Instant;

/// Lets through the first event of a run and then at most one per `every`.
#[derive(Debug)]
pub struct Throttle {
    /// `None`: only a run's first event is let through.
    every: Option<Duration>,
    run: Option<Run>,
}

#[derive(Debug, Clone, Copy)]
struct Run {
    since: Instant,
    passed: Instant,
    held: u64,
}

/// An event let through: time to log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The first event of a run.
    First,
    /// A later one, `held` events after the last let through, `lasting` into the run.
    Again { held: u64, lasting: Duration },
}

impl Pass {
    /// Events held back since the last one let through (none before a run's first).
    pub fn held(self) -> u64 {
        match self {
            Pass::First => 0,
            Pass::Again { held, .. } => held,
        }
    }
}

/// One line a second: the default for events that can come in floods.
impl Default for Throttle {
    fn default() -> Throttle {
        Throttle::every(Duration::from_secs(1))
    }
}

impl Throttle {
    /// One event per `every` (and a run's first at once).
    pub const fn every(every: Duration) -> Throttle {
        Throttle {
            every: Some(every),
            run: None,
        }
    }

    /// Only a run's first event: for an outage whose every retry would repeat the same line.
    pub const fn per_outage() -> Throttle {
        Throttle {
            every: None,
            run: None,
        }
    }

    /// Counts one event now; `Some` if it may be logged.
    pub fn hit(&mut self) -> Option<Pass> {
        self.hit_at(Instant::now())
    }

    /// [`Throttle::hit`] and only the number held back: for lines that say just that.
    pub fn allow(&mut self) -> Option<u64> {
        self.hit().map(Pass::held)
    }

    /// Counts one event at `now`; `Some` if it may be logged.
    pub fn hit_at(&mut self, now: Instant) -> Option<Pass> {
        let Some(run) = &mut self.run else {
            self.run = Some(Run {
                since: now,
                passed: now,
                held: 0,
            });
            return Some(Pass::First);
        };
        match self.every {
            Some(every) if now.duration_since(run.passed) >= every => {
                run.passed = now;
                Some(Pass::Again {
                    held: std::mem::take(&mut run.held),
                    lasting: now.duration_since(run.since),
                })
            }
            _ => {
                run.held += 1;
                None
            }
        }
    }

    /// Whether a run is on (an event since the last [`Throttle::end`]).
    pub fn in_run(&self) -> bool {
        self.run.is_some()
    }

    /// Ends the run, if one is on: how long it lasted, for a line saying it is over.
    pub fn end(&mut self) -> Option<Duration> {
        self.run.take().map(|run| run.since.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn lets_one_line_a_second_through_and_counts_the_rest() {
        let mut t = Throttle::default();
        assert_eq!(t.allow(), Some(0));
        assert_eq!(t.allow(), None);
        assert_eq!(t.allow(), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(t.allow(), Some(2));
        assert_eq!(t.allow(), None);
    }

    #[test]
    fn a_run_is_let_through_again_each_period_with_what_was_held_and_how_long_it_lasts() {
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let mut t = Throttle::every(Duration::from_secs(60));
        assert_eq!(t.hit_at(start), Some(Pass::First));
        assert_eq!(t.hit_at(at(1)), None);
        assert_eq!(t.hit_at(at(59)), None);
        let again = |held, secs| {
            Some(Pass::Again {
                held,
                lasting: Duration::from_secs(secs),
            })
        };
        assert_eq!(t.hit_at(at(60)), again(2, 60));
        assert_eq!(t.hit_at(at(61)), None);
        assert_eq!(t.hit_at(at(120)), again(1, 120));
    }

    #[test]
    fn per_outage_lets_only_the_first_through_until_the_outage_ends() {
        let start = Instant::now();
        let mut t = Throttle::per_outage();
        assert!(!t.in_run());
        assert_eq!(t.end(), None, "no outage, nothing to end");
        assert_eq!(t.hit_at(start), Some(Pass::First));
        assert!(t.in_run());
        assert_eq!(t.hit_at(start + Duration::from_secs(3600)), None);
        assert!(t.end().is_some());
        assert!(!t.in_run());
        assert_eq!(
            t.hit_at(start),
            Some(Pass::First),
            "a new outage is logged again"
        );
    }
}
