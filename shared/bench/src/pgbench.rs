//! pgbench, which drives the database side of the `links` modes and of mode `neighbour`: where
//! it is, the rate it reached, and waiting for it.

use std::path::PathBuf;

use crate::services::Proc;
use crate::{Bench, Res};

/// pgbench: on PATH, or beside initdb (where Debian's postgresql package puts it).
pub(crate) fn pgbench_bin() -> Res<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("pgbench"));
    let beside = testkit::pgtest::find_bindir().map(|d| d.join("pgbench"));
    on_path
        .chain(beside)
        .find(|p| p.is_file())
        .ok_or_else(|| "pgbench not found (Debian: apt-get install postgresql)".into())
}

/// The transactions a second pgbench reached, from its log ("tps = ...").
pub(crate) fn pgbench_rate(bench: &Bench, log: &str) -> f64 {
    let text = std::fs::read_to_string(bench.path(log)).unwrap_or_default();
    text.lines()
        .find_map(|l| {
            l.strip_prefix("tps = ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// Waits for pgbench; an error with the tail of its log if it failed.
pub(crate) async fn finish_pgbench(bench: &Bench, changer: Proc, log: &str) -> Res<()> {
    changer
        .finish()
        .await
        .map_err(|e| format!("{e}: {}", crate::services::tail(&bench.path(log), 3)).into())
}
