//! Durations as users write them, in flags and in the configuration file.
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

/// The shortest and longest durations any setting takes: below a microsecond (the finest unit
/// accepted) a value only rounds to nonsense, and past a year it overflows timers.
const MIN_DURATION: Duration = Duration::from_micros(1);
const MAX_DURATION: Duration = Duration::from_secs(365 * 86_400);

/// Parses "10s", "500ms", "100us", "2m", "1h" (a bare number is seconds), from 1us to 365 days.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().with_context(|| format!("invalid duration {text:?}: expected e.g. 10s, 500ms, 2m"))?;
    let seconds = match unit.trim() {
        "us" => value / 1e6,
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => bail!("invalid duration {text:?}: unknown unit {other:?} (use us, ms, s, m or h)"),
    };
    if !(seconds > 0.0) {
        bail!("invalid duration {text:?}: must be positive");
    }
    match Duration::try_from_secs_f64(seconds) {
        Ok(duration) if (MIN_DURATION..=MAX_DURATION).contains(&duration) => Ok(duration),
        _ => bail!("invalid duration {text:?}: must be between 1us and 365 days"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_reject_garbage() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn durations_too_small_or_too_large_are_one_line_errors_not_panics() {
        for text in ["0.0000000001s", "0.5us", "99999999999999999999999h", "400000000000000000000"] {
            let error = parse_duration(text).unwrap_err().to_string();
            assert!(error.contains("between 1us and 365 days") && !error.contains('\n'), "{text}: {error}");
        }
        assert_eq!(parse_duration("1us").unwrap(), Duration::from_micros(1));
    }
}
