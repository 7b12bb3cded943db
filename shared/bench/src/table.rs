//! The runs' TSV files and the medians the tables print.

use std::io::Write;
use std::path::Path;

use crate::Res;

/// Appends one tab-separated row to `file`.
pub(crate) fn append(file: &Path, fields: &[String]) -> Res<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    writeln!(f, "{}", fields.join("\t"))?;
    Ok(())
}

/// The rows of a TSV file, split into fields.
pub(crate) fn rows(file: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

/// Field `field` (1-based, as awk counts) of the rows whose first fields are `key`.
pub(crate) fn column(rows: &[Vec<String>], key: &[&str], field: usize) -> Vec<String> {
    rows.iter()
        .filter(|r| {
            key.iter()
                .enumerate()
                .all(|(i, k)| r.get(i).map(String::as_str) == Some(*k))
        })
        .filter_map(|r| r.get(field - 1).cloned())
        .collect()
}

/// The median of the values that are numbers, in full with up to 10 significant digits;
/// those that are not ("-": a round without the figure) left out. Where none is, the first
/// value as it is (a column of words), and "-" where there is none (no round): not the
/// first value where some are numbers, nor "" that reads as 0.
pub(crate) fn median(values: &[String]) -> String {
    let mut numbers: Vec<f64> = values.iter().filter_map(|v| v.parse().ok()).collect();
    if numbers.is_empty() {
        return values.first().cloned().unwrap_or_else(|| "-".to_owned());
    }
    g10(median_of(&mut numbers))
}

/// The median of numbers (NaN if none).
fn median_of(numbers: &mut [f64]) -> f64 {
    numbers.sort_by(f64::total_cmp);
    let n = numbers.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => numbers[n / 2],
        _ => (numbers[n / 2 - 1] + numbers[n / 2]) / 2.0,
    }
}

/// A number as printf's `%.10g` writes it.
pub(crate) fn g10(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let exp = x.abs().log10().floor() as i32;
    if !(-5..10).contains(&exp) {
        return format!("{x:.9e}");
    }
    let decimals = (9 - exp).max(0) as usize;
    let s = format!("{x:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// A median as a number, for ratios and `%.0f` cells (0 if none).
pub(crate) fn num(s: &str) -> f64 {
    s.parse().unwrap_or(0.0)
}

/// `a / b` with `decimals`, or `-` when b is 0.
pub(crate) fn ratio(a: f64, b: f64, decimals: usize) -> String {
    if b == 0.0 {
        return "-".to_owned();
    }
    format!("{:.decimals$}", a / b)
}

/// The items in turn from the one at index `by` (modulo their count): the order in which the
/// modes or variants of a round run, so that none always runs first (a run pays for what the
/// run before it left: a checkpoint, an autovacuum).
pub(crate) fn rotated<T: Clone>(by: usize, items: &[T]) -> Vec<T> {
    (0..items.len())
        .map(|i| items[(i + by) % items.len()].clone())
        .collect()
}

/// `this` over `base` in field `field` (1-based) of a TSV whose rows start with the variant
/// and the round, in the order the runs ran, round by round, split by which of the two ran
/// first in its round (the round's first row): a run pays for what the run before it left,
/// which moves a round's ratio one way or the other as the order turns, by more than many a
/// change. With as many rounds each way the median of all is balanced; with one more one way
/// it leans that way, so this gives each side's median and their geometric mean. A round
/// without a number for both, or with 0 for `base`, is left out; of duplicate rows, the first
/// counts.
pub(crate) fn order_balanced(rows: &[Vec<String>], this: &str, base: &str, field: usize) -> String {
    let (mut this_first, mut base_first) = (Vec::new(), Vec::new());
    let mut seen = Vec::new();
    for row in rows {
        let Some(round) = row.get(1).filter(|r| !seen.contains(*r)) else {
            continue;
        };
        seen.push(round.clone());
        let value = |variant| {
            let values = column(rows, &[variant, round.as_str()], field);
            values.first().and_then(|v| v.parse::<f64>().ok())
        };
        if let (Some(a), Some(b)) = (value(this), value(base).filter(|&b| b != 0.0)) {
            let side = if row[0] == this {
                &mut this_first
            } else {
                &mut base_first
            };
            side.push(a / b);
        }
    }
    let describe = |mut ratios: Vec<f64>| {
        let listed: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
        let median = median_of(&mut ratios);
        if listed.is_empty() {
            ("none".to_owned(), median)
        } else {
            (
                format!("{} (median {median:.3})", listed.join(", ")),
                median,
            )
        }
    };
    let ((first, m1), (second, m2)) = (describe(this_first), describe(base_first));
    let balanced = (m1 * m2).sqrt();
    let balanced = if balanced.is_nan() {
        "-".to_owned()
    } else {
        format!("{balanced:.3}")
    };
    format!("{this} first: {first}; {base} first: {second}; balanced: {balanced}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_as_awk_printed_them() {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(median(&v(&["3", "1", "2"])), "2");
        assert_eq!(median(&v(&["1216150", "1216160"])), "1216155");
        assert_eq!(median(&v(&["0.123", "0.125"])), "0.124");
        assert_eq!(median(&v(&["-", "-"])), "-");
        assert_eq!(
            median(&v(&["1.31", "-", "1.05"])),
            "1.18",
            "a round without it"
        );
        assert_eq!(median(&v(&[])), "-", "no round");
    }

    #[test]
    fn rotation_starts_at_the_round() {
        assert_eq!(rotated(1, &["a", "b", "c"]), ["b", "c", "a"]);
        assert_eq!(rotated(3, &["a", "b", "c"]), ["a", "b", "c"]);
    }

    #[test]
    fn ratios_split_by_who_ran_first() {
        let rows: Vec<Vec<String>> = [
            "current 1 0.9",
            "baseline 1 1.0",
            "baseline 2 1.0",
            "current 2 1.1",
            "current 3 0.8",
            "baseline 3 1.0",
            // Left out: a round with one variant, one with base 0, one without a number.
            "current 4 0.5",
            "baseline 5 0",
            "current 5 0.5",
            "current 6 -",
            "baseline 6 1.0",
        ]
        .iter()
        .map(|l| l.split(' ').map(str::to_owned).collect())
        .collect();
        assert_eq!(
            order_balanced(&rows, "current", "baseline", 3),
            "current first: 0.900, 0.800 (median 0.850); baseline first: 1.100 (median 1.100); \
             balanced: 0.967"
        );
        assert_eq!(
            order_balanced(&rows[..2], "current", "baseline", 3),
            "current first: 0.900 (median 0.900); baseline first: none; balanced: -"
        );
    }
}
