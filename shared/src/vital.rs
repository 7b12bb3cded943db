//! The parts a process needs for its whole life: its listeners' tasks, its loader thread, its
//! upkeep. tokio keeps a task's panic to the task, and a thread's panic ends only the thread:
//! without a word to the rest, the process would go on without the part (a redirector that
//! no longer accepts, a collector that no longer folds), healthy to systemd. So each part holds
//! a [`Vital`] for as long as it runs, and the process waits for its stop signal through
//! [`Vitals::until`]: the first part to end before the stop stops the process as the signal
//! would, and it then exits with an error, for systemd to start it again. A part that ends
//! after the stop (aborted, or failing while the process winds down) is no such error.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The process's vital parts: whether one ended before the stop, and which first.
#[derive(Clone)]
pub struct Vitals {
    state: Arc<watch::Sender<State>>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum State {
    Running,
    /// This part ended first, before the stop.
    Ended(&'static str),
    /// The stop came first.
    Stopping,
}

/// Held by a vital part for as long as it runs, in its task's future or its thread's closure:
/// dropped, by a return or by a panic's unwinding, the part has ended.
pub struct Vital {
    part: &'static str,
    state: Arc<watch::Sender<State>>,
}

impl Default for Vitals {
    fn default() -> Vitals {
        Vitals {
            state: Arc::new(watch::Sender::new(State::Running)),
        }
    }
}

impl Vitals {
    /// The token for the part named `part` (as a log line says it: "the http server").
    #[must_use = "the part has ended once its token is dropped"]
    pub fn part(&self, part: &'static str) -> Vital {
        Vital {
            part,
            state: self.state.clone(),
        }
    }

    /// Holds `part`'s token while `task` runs: for a task spawned where no token can be given.
    pub fn hold_while<T: Send + 'static>(&self, part: &'static str, task: JoinHandle<T>) {
        let vital = self.part(part);
        tokio::spawn(async move {
            let _ = task.await;
            drop(vital);
        });
    }

    /// Waits for `stop` (the stop signal), or for a part to end, whichever comes first: the
    /// signal's output, or the part, which it logs as the error it is. `Ok` means no part
    /// ended before the stop ([`Vitals::ended`] says `None`).
    pub async fn until<T>(&self, stop: impl Future<Output = T>) -> Result<T, &'static str> {
        let part = tokio::select! {
            // The signal first, always: a tie is settled by the state its arm reads.
            biased;
            stopped = stop => match mark(&self.state, State::Stopping) {
                // A part ended as the signal came: the part's end is what stopped it.
                State::Ended(part) => part,
                State::Running | State::Stopping => return Ok(stopped),
            },
            part = self.first_ended() => part,
        };
        crate::fatal!("{part} ended before the stop; stopping as a signal would, then exiting");
        Err(part)
    }

    /// The part that ended before the stop, if one did.
    pub fn ended(&self) -> Option<&'static str> {
        match *self.state.borrow() {
            State::Ended(part) => Some(part),
            State::Running | State::Stopping => None,
        }
    }

    /// The first part that ended before the stop; pending while every part runs, and after
    /// the stop.
    async fn first_ended(&self) -> &'static str {
        let mut state = self.state.subscribe();
        // The sender is this value's own: it cannot close while this waits.
        if let Ok(ended) = state.wait_for(|s| matches!(s, State::Ended(_))).await {
            if let State::Ended(part) = *ended {
                return part;
            }
        }
        std::future::pending().await
    }
}

/// Moves from `Running` to `to`, the first move only; the state that holds after.
fn mark(state: &watch::Sender<State>, to: State) -> State {
    let mut after = to;
    state.send_if_modified(|now| {
        let first = *now == State::Running;
        if first {
            *now = to;
        }
        after = *now;
        first
    });
    after
}

impl Drop for Vital {
    fn drop(&mut self) {
        let _ = mark(&self.state, State::Ended(self.part));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An hour of the paused clock: that is, for good.
    const FOR_GOOD: Duration = Duration::from_secs(3600);

    /// The part seen ended first, if one is within an hour.
    async fn ended_within(vitals: &Vitals) -> Option<&'static str> {
        let wait = tokio::time::timeout(FOR_GOOD, vitals.first_ended());
        wait.await.ok()
    }

    #[tokio::test(start_paused = true)]
    async fn the_stop_signal_ends_the_wait_and_a_part_that_ends_after_it_is_no_error() {
        let vitals = Vitals::default();
        let server = vitals.part("the http server");
        assert_eq!(vitals.until(async { "SIGTERM" }).await, Ok("SIGTERM"));
        drop(server);
        assert_eq!(vitals.ended(), None, "a part that ends after the stop");
        assert_eq!(
            ended_within(&vitals).await,
            None,
            "a part that ends after the stop"
        );
    }

    /// A part that ended when the signal is there too is what stopped the process, whichever
    /// the wait sees first.
    #[tokio::test(start_paused = true)]
    async fn a_part_that_ended_as_the_signal_came_is_the_error() {
        let vitals = Vitals::default();
        drop(vitals.part("the fold"));
        let stopped = vitals.until(async { "SIGTERM" }).await;
        assert_eq!(stopped, Err("the fold"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_panics_is_the_first_ended_and_stays_it() {
        let vitals = Vitals::default();
        let server = vitals.part("the http server");
        let _loader = vitals.part("the link loader");
        let running = ended_within(&vitals).await;
        assert_eq!(running, None, "ended with every part running");
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
    async fn a_thread_that_panics_and_a_held_task_that_returns_are_ended() {
        let vitals = Vitals::default();
        let loader = vitals.part("the link loader");
        let thread = std::thread::spawn(move || {
            let _loader = loader;
            panic!("a defect");
        });
        assert!(thread.join().is_err());
        assert_eq!(ended_within(&vitals).await, Some("the link loader"));

        let vitals = Vitals::default();
        let (go, gone) = tokio::sync::oneshot::channel::<()>();
        vitals.hold_while("the admin listener", tokio::spawn(gone));
        assert_eq!(
            ended_within(&vitals).await,
            None,
            "ended while the task runs"
        );
        drop(go);
        assert_eq!(ended_within(&vitals).await, Some("the admin listener"));
    }
}
