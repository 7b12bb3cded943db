//! Capped exponential backoff, for every reconnect loop: the redirector to the collector's
//! socket and to the database, the collector to the database.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(first: Duration, cap: Duration) -> Backoff {
        Backoff {
            first,
            cap,
            next: first,
        }
    }

    /// The wait before the next attempt; each call doubles the following one, up to the cap.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.cap);
        wait
    }

    /// Sleeps the next wait.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_wait()).await;
    }

    /// After a success: the next failure waits the shortest time again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(50), ms(300));
        let waits: Vec<_> = (0..5).map(|_| b.next_wait()).collect();
        assert_eq!(waits, [ms(50), ms(100), ms(200), ms(300), ms(300)]);
        b.reset();
        assert_eq!(b.next_wait(), ms(50));
    }
}
