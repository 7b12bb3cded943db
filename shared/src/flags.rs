//! Parsers for command-line values that every binary shares, so that a flag means the same
//! thing, and is refused for the same reasons, wherever it appears.

use std::time::Duration;

/// The longest duration any flag takes. Far above any sensible setting, and far below what
/// would overflow an `Instant` or a timer when added to now.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The shortest duration any flag takes: tokio's timers count in milliseconds, so a shorter
/// one would act as a millisecond while saying less (`1ns` looks like "at once").
pub const MIN_DURATION: Duration = Duration::from_millis(1);

/// A duration such as `100ms`, `5s` or `1h 30m` (humantime's syntax). Zero is refused: every
/// duration flag is an interval, a timeout or a wait, and zero would make a timer spin or a
/// wait give up at once. So is anything under [`MIN_DURATION`] or over [`MAX_DURATION`].
pub fn duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration: {e}"))?;
    if d.is_zero() {
        return Err(format!(
            "{s:?} is zero; it must be more than zero (an interval or timeout of zero would spin or give up at once)"
        ));
    }
    if d < MIN_DURATION {
        return Err(format!(
            "{s:?} is under 1ms, the timers' resolution; it must be at least 1ms"
        ));
    }
    if d > MAX_DURATION {
        return Err(format!("{s:?} is over the longest allowed, 365 days"));
    }
    Ok(d)
}

/// A socket file's mode in octal (`660`, `0660` or `0o660`), at most `0777` (socket files
/// need no other bits), with a write bit: sending to a socket needs one, and without any, no
/// peer but root could.
pub fn mode(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    let mode = u32::from_str_radix(digits, 8)
        .map_err(|e| format!("{s:?} is not octal, as a file mode such as 660 is: {e}"))?;
    if mode > 0o777 {
        return Err(format!("{s} is above 0777"));
    }
    if mode & 0o222 == 0 {
        return Err(format!(
            "{s} lets no one write to the socket, and a peer sends to it by writing: \
             give its owner or group the write bit (660, say)"
        ));
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_up_to_0777() {
        assert_eq!(mode("660"), Ok(0o660));
        assert_eq!(mode("0620"), Ok(0o620));
        assert_eq!(mode("0o600"), Ok(0o600));
        assert!(mode("999").unwrap_err().contains("not octal"));
        assert!(mode("1777").unwrap_err().contains("above 0777"));
        for no_one_writes in ["0", "444", "0o550"] {
            assert!(mode(no_one_writes).unwrap_err().contains("no one"));
        }
        assert_eq!(mode("200"), Ok(0o200));
    }

    #[test]
    fn parses_units_and_refuses_zero_garbage_and_absurd_values_with_the_reason() {
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert!(duration("0s").unwrap_err().contains("more than zero"));
        assert!(duration("0").unwrap_err().contains("more than zero"));
        assert!(duration("999us").unwrap_err().contains("at least 1ms"));
        assert!(duration("1ns").unwrap_err().contains("at least 1ms"));
        assert_eq!(duration("1ms"), Ok(MIN_DURATION));
        assert!(duration("soon").unwrap_err().contains("not a duration"));
        assert!(duration("400days").unwrap_err().contains("365 days"));
        assert!(duration("18446744073709551615s").is_err());
    }
}
