//! The modes not yet ported, still the bash of scripts/lib/bench-legacy.sh (with wrk, pgbench
//! and awk), and the charts, drawn by scripts/bench-charts.py from the runs' TSV files.

use std::process::Command;

use crate::knobs::Knobs;
use crate::services::run;
use crate::{log, Res};

/// The modes the bash script still runs.
pub(crate) const MODES: [&str; 6] = [
    "compaction",
    "hosts",
    "partitions",
    "links",
    "links-follow",
    "links-soak",
];

/// Those of them that `all` runs, in its order.
pub(crate) const IN_ALL: [&str; 4] = ["compaction", "hosts", "partitions", "links"];

/// Runs `modes` with the bash script, which sets up its cluster and databases itself; its
/// exit code.
pub(crate) fn run_modes(modes: &[&str]) -> Res<i32> {
    let status = Command::new("bash")
        .arg("scripts/lib/bench-legacy.sh")
        .args(modes)
        .status()
        .map_err(|e| format!("running scripts/lib/bench-legacy.sh: {e}"))?;
    Ok(status.code().unwrap_or(1))
}

/// The SVG charts in benchmarks/, from $OUT's TSV files; matplotlib from PyPI if missing.
pub(crate) fn charts(knobs: &Knobs) -> Res<()> {
    let has_matplotlib = Command::new("python3")
        .args(["-c", "import matplotlib"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_matplotlib {
        log("installing matplotlib (PyPI)");
        run(Command::new("python3").args(["-m", "pip", "install", "-q", "matplotlib"]))
            .map_err(|e| format!("pip install matplotlib failed: {e}"))?;
    }
    std::fs::create_dir_all("benchmarks")?;
    run(Command::new("python3")
        .arg("scripts/bench-charts.py")
        .arg(&knobs.out)
        .arg("benchmarks"))
    .map_err(|e| format!("drawing the charts failed: {e}"))?;
    log("charts in benchmarks/");
    Ok(())
}
