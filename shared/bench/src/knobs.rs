//! The knobs: environment variables, read once, each refused with its name and the reason
//! when it cannot be used (never a panic deep in a run).

use std::path::PathBuf;
use std::str::FromStr;

use crate::Res;

/// The links every redirect and ingest run draws its codes from (`seed0` ...).
pub(crate) const CODES: u64 = 250_000;

#[derive(Debug, Clone)]
pub(crate) struct Knobs {
    pub(crate) rounds: u32,
    /// Seconds per load run.
    pub(crate) duration: u64,
    pub(crate) connections: usize,
    /// Requests a second of a redirect run; none: as fast as the connections get answers.
    pub(crate) redirect_rate: Option<u64>,
    /// The CPU the redirector runs on alone, everything else on the others (`cpus`).
    pub(crate) redirect_cpu: Option<usize>,
    /// Rows per ingest run.
    pub(crate) clicks: u64,
    /// Clicks per compaction run.
    pub(crate) sustain: u64,
    pub(crate) collector_flags: Vec<String>,
    pub(crate) baseline: Option<String>,
    pub(crate) flat: bool,
    pub(crate) current_rev: Option<String>,
    /// Redirect modes, `baseline` added when BASELINE is set (`paired-baseline` when they have
    /// `paired`).
    pub(crate) modes: Vec<String>,
    /// The `--dimensions` of mode `dimensions`; none: the mode runs without the flag.
    pub(crate) dimensions: Option<String>,
    /// INSERTs a second of mode `neighbour`'s stand-in for the pipeline's database work.
    pub(crate) neighbour_rate: u64,
    /// The redirector's `--flush-interval`, given to every build alike: a BASELINE from before
    /// its default changed runs with the same.
    pub(crate) flush_interval: String,
    /// Clicks a second of a totals run, and its length in seconds.
    pub(crate) rate: u64,
    pub(crate) totals_secs: u64,
    /// The dimensions every click of a totals run carries besides the agent; none by default.
    pub(crate) totals_dimensions: Option<String>,
    pub(crate) out: PathBuf,
    /// Link table sizes of the links modes.
    pub(crate) link_counts: Vec<u64>,
    /// Link changes a second of `links` and `links-follow`.
    pub(crate) change_rate: u64,
    /// Seconds of `links-soak`, and its changes a second.
    pub(crate) soak: u64,
    pub(crate) soak_rate: u64,
    /// Distinct codes of a `memory` run.
    pub(crate) distinct: u64,
}

const REDIRECT_MODES: [&str; 9] = [
    "off",
    "pipeline",
    "direct",
    "dimensions",
    "neighbour",
    "paired",
    "paired-aa",
    "baseline",
    "paired-baseline",
];

/// Adds BASELINE's mode to `modes` when there is a BASELINE: its binaries measured the way
/// the current ones are, paired when they are, unless `modes` names a mode of them. An error
/// for such a mode without a BASELINE.
fn with_baseline_mode(modes: &mut Vec<String>, baseline: bool) -> Res<()> {
    let named = modes.iter().find(|m| m.ends_with("baseline"));
    match (named, baseline) {
        (Some(mode), false) => {
            Err(format!("MODES has {mode} but BASELINE (a git revision) is not set").into())
        }
        (None, true) => {
            let paired = modes.iter().any(|m| m == "paired");
            let mode = if paired {
                "paired-baseline"
            } else {
                "baseline"
            };
            modes.push(mode.to_owned());
            Ok(())
        }
        _ => Ok(()),
    }
}

/// What `--dimensions` may list.
const DIMENSIONS: [&str; 3] = ["referrer", "device", "country"];

impl Knobs {
    pub(crate) fn from_env(quick: bool) -> Res<Knobs> {
        // --quick's defaults: a few seconds per mode, and counts folded each second rather
        // than at the default minute, since each ingest run waits for them.
        let (rounds, duration, clicks) = if quick {
            (1, 2, 200_000)
        } else {
            (3, 10, 2_000_000)
        };
        let collector_flags = match std::env::var("COLLECTOR_FLAGS") {
            Ok(flags) => flags,
            Err(_) if quick => "--compact-interval 1s".to_owned(),
            Err(_) => String::new(),
        };
        let baseline = text("BASELINE");
        let redirect_cpu = text("REDIRECT_CPU")
            .map(|v| crate::cpus::parse(&v, crate::cpus::count()))
            .transpose()?;
        // --quick runs paired too, so that the smoke test starts its two redirectors (unless
        // REDIRECT_CPU is set, which paired cannot share).
        let default_modes = if quick && redirect_cpu.is_none() {
            "off pipeline direct paired"
        } else {
            "off pipeline direct"
        };
        let mut modes: Vec<String> = text("MODES")
            .unwrap_or_else(|| default_modes.to_owned())
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        if let Some(bad) = modes.iter().find(|m| !REDIRECT_MODES.contains(&m.as_str())) {
            return Err(format!(
                "MODES: unknown mode {bad:?} ({})",
                REDIRECT_MODES.join(", ")
            )
            .into());
        }
        with_baseline_mode(&mut modes, baseline.is_some())?;
        let paired = modes.iter().find(|m| m.starts_with("paired"));
        if let (Some(_), Some(mode)) = (redirect_cpu, paired) {
            // Both redirectors would share the one CPU, which is then no longer the
            // redirector's alone.
            return Err(
                format!("REDIRECT_CPU cannot be used with mode {mode} (two redirectors)").into(),
            );
        }
        Ok(Knobs {
            rounds: positive("ROUNDS", rounds)?,
            duration: positive("DURATION", duration)?,
            connections: positive("CONNECTIONS", 50)?,
            redirect_rate: optional_positive("REDIRECT_RATE")?,
            redirect_cpu,
            clicks: positive("CLICKS", clicks)?,
            sustain: positive("SUSTAIN", 15_000_000)?,
            collector_flags: collector_flags
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            baseline,
            flat: text("FLAT").is_some(),
            current_rev: text("CURRENT_REV"),
            modes,
            dimensions: dimensions("DIMENSIONS", &DIMENSIONS.join(","))?,
            neighbour_rate: positive("NEIGHBOUR_RATE", 650)?,
            flush_interval: flush_interval()?,
            rate: positive("RATE", 90_000)?,
            totals_secs: positive("TOTALS_SECS", 120)?,
            totals_dimensions: dimensions("TOTALS_DIMENSIONS", "none")?,
            out: PathBuf::from(text("OUT").unwrap_or_else(|| "bench-out".to_owned())),
            link_counts: link_counts()?,
            change_rate: positive("CHANGE_RATE", 100)?,
            soak: positive("SOAK", 600)?,
            soak_rate: positive("SOAK_RATE", 1000)?,
            distinct: positive("DISTINCT", 10_000_000)?,
        })
    }
}

/// REDIRECTOR_FLUSH_INTERVAL: the redirector's own variable, read here to be passed as its
/// flag to every build; the current default when unset.
fn flush_interval() -> Res<String> {
    let value = text("REDIRECTOR_FLUSH_INTERVAL").unwrap_or_else(|| "50ms".to_owned());
    shared::flags::duration(&value).map_err(|e| format!("REDIRECTOR_FLUSH_INTERVAL: {e}"))?;
    Ok(value)
}

/// LINK_COUNTS: table sizes, whole numbers above 0 separated by spaces.
fn link_counts() -> Res<Vec<u64>> {
    let value = text("LINK_COUNTS").unwrap_or_else(|| "1000000 10000000".to_owned());
    value
        .split_whitespace()
        .map(|n| match n.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("LINK_COUNTS must be whole numbers above 0, not {value:?}").into()),
        })
        .collect()
}

/// DIMENSIONS and TOTALS_DIMENSIONS: a comma-separated subset of referrer, device and
/// country, or `none`.
fn dimensions(name: &str, default: &str) -> Res<Option<String>> {
    let value = text(name).unwrap_or_else(|| default.to_owned());
    let value = value.trim();
    if value == "none" {
        return Ok(None);
    }
    match value.split(',').find(|d| !DIMENSIONS.contains(d)) {
        Some(bad) => Err(format!(
            "{name}: unknown dimension {bad:?} in {value:?} (a comma-separated subset of {}, or none)",
            DIMENSIONS.join(",")
        )
        .into()),
        None => Ok(Some(value.to_owned())),
    }
}

/// A variable's value; unset and empty alike are none.
fn text(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A whole number above zero, or none when unset.
fn optional_positive<T: FromStr + PartialOrd + Default + Copy>(name: &str) -> Res<Option<T>> {
    text(name).map(|_| positive(name, T::default())).transpose()
}

/// A whole number above zero, or `default` when unset.
fn positive<T: FromStr + PartialOrd + Default + Copy>(name: &str, default: T) -> Res<T> {
    let Some(value) = text(name) else {
        return Ok(default);
    };
    match value.trim().parse::<T>() {
        Ok(n) if n > T::default() => Ok(n),
        _ => Err(format!("{name} must be a whole number above 0, not {value:?}").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modes(list: &str, baseline: bool) -> Result<String, String> {
        let mut modes = list.split_whitespace().map(str::to_owned).collect();
        with_baseline_mode(&mut modes, baseline).map_err(|e| e.to_string())?;
        Ok(modes.join(" "))
    }

    #[test]
    fn a_baseline_runs_paired_beside_paired_once_and_never_without_baseline() {
        assert_eq!(
            modes("off pipeline", true).unwrap(),
            "off pipeline baseline"
        );
        assert_eq!(modes("paired", true).unwrap(), "paired paired-baseline");
        // Named: nothing added.
        assert_eq!(modes("paired-baseline", true).unwrap(), "paired-baseline");
        assert_eq!(modes("baseline paired", true).unwrap(), "baseline paired");
        assert_eq!(modes("off pipeline", false).unwrap(), "off pipeline");
        let refused = modes("paired paired-baseline", false).unwrap_err();
        assert!(
            refused.contains("MODES has paired-baseline but BASELINE"),
            "{refused}"
        );
    }
}
