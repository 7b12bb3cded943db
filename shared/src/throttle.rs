//! Log lines about something that can happen thousands of times a second (a rejected
//! datagram, a failed send) are let through at most once a second, each saying how many were
//! held back since the last one.

use std::time::Duration;

use tokio::time::Instant;

const EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub struct Throttle {
    last: Option<Instant>,
    held: u64,
}

impl Throttle {
    /// `Some(lines held back since the last one)` if a line may be logged now.
    pub fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < EVERY) {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
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
        tokio::time::advance(EVERY).await;
        assert_eq!(t.allow(), Some(2));
    }
}
