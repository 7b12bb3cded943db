//! The parts a process needs for its whole life: its listeners' tasks, its loader thread, its
//! upkeep. tokio keeps a task's panic to the task, and a thread's panic ends only the thread:
//! without a word to the rest, the process would go on without the part (a redirector that
//! no longer accepts, a collector that no longer folds), healthy to systemd. So each part holds
//! a [`Vital`] for as long as it runs, and the process waits on [`Vitals::first_ended`] beside
//! its stop signal: the first part to end, before the stop, stops the process as a signal
//! would, and it then exits with an error, for systemd to start it again.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The process's vital parts: which one ended first, if any has.
#[derive(Clone)]
pub struct Vitals {
    ended: Arc<watch::Sender<Option<&'static str>>>,
}

/// Held by a vital part for as long as it runs, in its task's future or its thread's closure:
/// dropped, by a return or by a panic's unwinding, the part has ended.
pub struct Vital {
    part: &'static str,
    ended: Arc<watch::Sender<Option<&'static str>>>,
}

impl Default for Vitals {
    fn default() -> Vitals {
        Vitals {
            ended: Arc::new(watch::Sender::new(None)),
        }
    }
}

impl Vitals {
    /// The token for the part named `part` (as a log line says it: "the http server").
    pub fn part(&self, part: &'static str) -> Vital {
        Vital {
            part,
            ended: self.ended.clone(),
        }
    }

    /// Holds `part`'s token until `task` ends: for a task spawned where no token can be given.
    pub fn watch<T: Send + 'static>(&self, part: &'static str, task: JoinHandle<T>) {
        let vital = self.part(part);
        tokio::spawn(async move {
            let _ = task.await;
            drop(vital);
        });
    }

    /// The first part that ended; pending while every part runs.
    pub async fn first_ended(&self) -> &'static str {
        let mut ended = self.ended.subscribe();
        // The sender is this value's own: it cannot close while this waits.
        let first = ended.wait_for(Option::is_some).await;
        first.ok().and_then(|part| *part).unwrap_or("a vital part")
    }

    /// Waits for `stop` (the stop signal), or for a part to end, whichever comes first: the
    /// signal's output, or the part, which it logs as the error it is.
    pub async fn until<T>(&self, stop: impl Future<Output = T>) -> Result<T, &'static str> {
        tokio::select! {
            stopped = stop => Ok(stopped),
            part = self.first_ended() => {
                crate::fatal!("{part} ended before the stop; stopping as a signal would, then exiting");
                Err(part)
            }
        }
    }

    /// The first part that ended, if any has by now.
    pub fn ended(&self) -> Option<&'static str> {
        *self.ended.borrow()
    }
}

impl Drop for Vital {
    fn drop(&mut self) {
        let part = self.part;
        self.ended.send_if_modified(|first| {
            let is_first = first.is_none();
            if is_first {
                *first = Some(part);
            }
            is_first
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_stop_signal_ends_the_wait_while_every_part_runs() {
        let vitals = Vitals::default();
        let _server = vitals.part("the http server");
        assert_eq!(vitals.until(async { "SIGTERM" }).await, Ok("SIGTERM"));
        assert_eq!(vitals.ended(), None);
    }

    /// An hour of the paused clock: that is, for good.
    const FOR_GOOD: Duration = Duration::from_secs(3600);

    async fn still_pending(vitals: &Vitals) -> bool {
        let wait = tokio::time::timeout(FOR_GOOD, vitals.first_ended());
        wait.await.is_err()
    }

    async fn first_ended(vitals: &Vitals) -> &'static str {
        let wait = tokio::time::timeout(FOR_GOOD, vitals.first_ended());
        wait.await.expect("no part seen ended")
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_panics_is_the_first_ended_and_stays_it() {
        let vitals = Vitals::default();
        let server = vitals.part("the http server");
        let _loader = vitals.part("the link loader");
        assert!(
            still_pending(&vitals).await,
            "ended with every part running"
        );
        let task = tokio::spawn(async move {
            let _server = server;
            panic!("a defect");
        });
        assert!(task.await.unwrap_err().is_panic());
        let stopped = vitals.until(tokio::time::sleep(FOR_GOOD)).await;
        assert_eq!(stopped, Err("the http server"));
        let later = vitals.part("the admin listener");
        drop(later);
        assert_eq!(vitals.ended(), Some("the http server"), "the first stays");
    }

    #[tokio::test(start_paused = true)]
    async fn a_thread_that_panics_and_a_watched_task_that_returns_are_ended() {
        let vitals = Vitals::default();
        let loader = vitals.part("the link loader");
        let thread = std::thread::spawn(move || {
            let _loader = loader;
            panic!("a defect");
        });
        assert!(thread.join().is_err());
        assert_eq!(first_ended(&vitals).await, "the link loader");

        let vitals = Vitals::default();
        let (go, gone) = tokio::sync::oneshot::channel::<()>();
        vitals.watch("the admin listener", tokio::spawn(gone));
        assert!(still_pending(&vitals).await, "ended while the task runs");
        drop(go);
        assert_eq!(first_ended(&vitals).await, "the admin listener");
    }
}
