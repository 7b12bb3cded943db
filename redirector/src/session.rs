//! What every database session of the redirector has besides its settings
//! (`shared::db::Config::guarded`, with `--link-timeout`): a connection task that ends with
//! its owner. The link loader's sessions and `--clicks direct`'s use it alike.

/// A spawned task that is aborted when its owner goes away: a session's connection, which
/// tokio-postgres would otherwise keep open while an answer is still due.
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
