//! `charts`: the SVG charts of BENCHMARKS.md, drawn by scripts/bench-charts.py (matplotlib)
//! from the runs' TSV files in $OUT.

use std::process::Command;

use crate::knobs::Knobs;
use crate::services::run;
use crate::{log, Res};

/// The SVG charts in benchmarks/, from $OUT's TSV files; matplotlib from PyPI if missing.
pub(crate) fn draw(knobs: &Knobs) -> Res<()> {
    let has_matplotlib = Command::new("python3")
        .args(["-c", "import matplotlib"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_matplotlib {
        log("installing matplotlib (PyPI)");
        // Debian's Python refuses pip outside a virtual environment (PEP 668).
        run(Command::new("python3").args(["-m", "pip", "install", "-q", "matplotlib"])).map_err(
            |e| {
                format!(
                    "pip install matplotlib failed ({e}): install it with the system's \
                     packages (Debian: apt-get install python3-matplotlib), then \
                     `scripts/bench charts`"
                )
            },
        )?;
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
