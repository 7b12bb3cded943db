//! Mode `neighbour` of `redirect`: clicks off, beside a stand-in for the database work the
//! pipeline brings, with no pipeline: pgbench making single-row INSERTs into a scratch table at
//! NEIGHBOUR_RATE transactions a second. Whether a busy PostgreSQL alone slows the redirector's
//! request path (BENCHMARKS.md, "A PostgreSQL neighbour without the pipeline").

use std::process::Command;
use std::time::Duration;

use crate::knobs::CODES;
use crate::pgbench::{finish_pgbench, pgbench_bin, pgbench_rate};
use crate::services::Proc;
use crate::{log, Bench, Res, Variant};

const TABLE: &str = "CREATE TABLE IF NOT EXISTS bench_neighbour \
    (id bigserial PRIMARY KEY, code text NOT NULL, at timestamptz NOT NULL)";

/// The neighbour under way, and the name of its log in $OUT.
pub(crate) struct Neighbour {
    pgbench: Proc,
    log_file: String,
}

/// Starts the neighbour for a load run of `secs` seconds, and lets it get under way first.
pub(crate) async fn start(bench: &Bench, secs: u64, run: &str) -> Res<Neighbour> {
    let client = bench.client(Variant::Current).await?;
    crate::cluster::execute(&client, TABLE).await?;
    let script = bench.path("neighbour.sql");
    std::fs::write(
        &script,
        format!(
            "\\set n random(0, {})\nINSERT INTO bench_neighbour (code, at) VALUES ('seed' || :n, now());\n",
            CODES - 1
        ),
    )?;
    let rate = bench.knobs.neighbour_rate.to_string();
    let mut cmd = Command::new(pgbench_bin()?);
    // Two clients, as one waiting for each commit may not reach the rate.
    cmd.args(["-n", "-c", "2", "-j", "1", "-R", &rate])
        .args(["-T", &(secs + 1).to_string(), "-f"])
        .arg(&script)
        .arg(bench.url(Variant::Current));
    let log_file = format!("neighbour-{run}.log");
    let path = bench.path(&log_file);
    let _ = std::fs::remove_file(&path);
    let pgbench = Proc::spawn("pgbench", cmd, &path)?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(Neighbour { pgbench, log_file })
}

impl Neighbour {
    /// Waits for the neighbour to end, and logs the rate it reached.
    pub(crate) async fn finish(self, bench: &Bench) -> Res<()> {
        finish_pgbench(bench, self.pgbench, &self.log_file).await?;
        log(&format!(
            "neighbour: {:.0} INSERTs a second (NEIGHBOUR_RATE {})",
            pgbench_rate(bench, &self.log_file),
            bench.knobs.neighbour_rate
        ));
        Ok(())
    }
}
