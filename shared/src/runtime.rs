//! The multi-thread runtime both services run on. Its worker count is read from
//! `TOKIO_WORKER_THREADS` here, not by tokio, which panics on a value it cannot use (`0`, a
//! word, an `EnvironmentFile` line with no number) before anything is logged.

use std::ffi::OsString;
use std::num::NonZeroUsize;

/// The environment variable that sets the runtime's worker threads.
pub const WORKER_THREADS: &str = "TOKIO_WORKER_THREADS";

/// More workers than this is a slip of the keyboard, not a machine.
const MAX_WORKER_THREADS: usize = 1024;

/// The runtime: `TOKIO_WORKER_THREADS` workers, or one per CPU where it is unset or empty.
pub fn build() -> Result<tokio::runtime::Runtime, String> {
    let workers = worker_threads(std::env::var_os(WORKER_THREADS))?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime's {workers} worker threads: {e}"))
}

/// The worker count `value` of `TOKIO_WORKER_THREADS` asks for.
fn worker_threads(value: Option<OsString>) -> Result<usize, String> {
    let text = value.as_ref().map(|v| v.to_str().map(str::trim));
    match text {
        None | Some(Some("")) => {
            Ok(std::thread::available_parallelism().map_or(1, NonZeroUsize::get))
        }
        Some(Some(t)) => match t.parse::<usize>() {
            Ok(n @ 1..=MAX_WORKER_THREADS) => Ok(n),
            _ => Err(refused(&value)),
        },
        Some(None) => Err(refused(&value)),
    }
}

fn refused(value: &Option<OsString>) -> String {
    format!(
        "{WORKER_THREADS}={:?} is not a number of runtime worker threads from 1 to \
         {MAX_WORKER_THREADS} (unset or empty: one per CPU)",
        value.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_count_is_a_number_from_one_to_the_ceiling_and_empty_is_unset() {
        let cpus = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        let of = |v: &str| worker_threads(Some(v.into()));
        assert_eq!(worker_threads(None), Ok(cpus));
        assert_eq!(of(""), Ok(cpus));
        assert_eq!(of(" 3 "), Ok(3));
        assert_eq!(of("1024"), Ok(1024));
        for bad in ["0", "-1", "two", "1025", "99999999999999999999999"] {
            let e = of(bad).expect_err(bad);
            assert!(e.contains(WORKER_THREADS) && e.contains(bad), "{e}");
        }
    }
}
