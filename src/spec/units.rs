//! Parsers for the value forms of docs/rules.md#value-forms-and-unknown-keys: Spark memory strings, disk
//! sizes, allocation timeouts and proto3 JSON durations. Each returns the
//! accepted form in its error so callers can quote it back to the user.

use std::sync::LazyLock;

use regex::Regex;

/// Spark's byte-string suffixes, in MiB per unit; a bare number is MiB.
const MEMORY_UNITS: &[(&str, f64)] = &[
    ("", 1.0),
    ("b", 1.0 / (1024.0 * 1024.0)),
    ("k", 1.0 / 1024.0),
    ("kb", 1.0 / 1024.0),
    ("m", 1.0),
    ("mb", 1.0),
    ("g", 1024.0),
    ("gb", 1024.0),
    ("t", 1024.0 * 1024.0),
    ("tb", 1024.0 * 1024.0),
];

static NUMBER_UNIT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([0-9]{1,15})([a-zA-Z]*)$").expect("static regex"));

/// Parses a Spark memory string (`512m`, `4g`, `1024` = MiB) into whole MiB.
pub fn parse_memory_mb(value: &str) -> Result<u64, &'static str> {
    const FORM: &str = "a whole number with an optional unit k, m, g or t (e.g. 4096m or 4g; a bare number is MiB)";
    let caps = NUMBER_UNIT.captures(value).ok_or(FORM)?;
    let number: u64 = caps[1].parse().map_err(|_| FORM)?;
    let unit = caps[2].to_ascii_lowercase();
    let factor = MEMORY_UNITS
        .iter()
        .find(|(u, _)| *u == unit)
        .map(|(_, f)| *f)
        .ok_or(FORM)?;
    let mb = (number as f64 * factor).floor();
    if mb > 1e15 {
        return Err(FORM);
    }
    Ok(mb as u64)
}

/// Parses a disk size of the `375g` form into GB (`t` = 1000 g is not
/// accepted: sizes are written in g, as the service documents them).
pub fn parse_size_gb(value: &str) -> Result<u64, &'static str> {
    const FORM: &str = "a whole number of gigabytes with the suffix g (e.g. 375g)";
    let caps = NUMBER_UNIT.captures(value).ok_or(FORM)?;
    if !caps[2].eq_ignore_ascii_case("g") {
        return Err(FORM);
    }
    caps[1].parse().map_err(|_| FORM)
}

static WHOLE_SECONDS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([0-9]{1,10})s$").expect("static regex"));

/// Parses an allocation timeout: whole seconds with the suffix `s`, from 1
/// to `max_s`.
pub fn parse_allocation_timeout(value: &str, max_s: u64) -> Result<u64, String> {
    let form = format!(
        "whole seconds with the suffix \"s\", from \"1s\" to \"{max_s}s\" (e.g. \"1800s\")"
    );
    let caps = WHOLE_SECONDS.captures(value).ok_or_else(|| form.clone())?;
    let secs: u64 = caps[1].parse().map_err(|_| form.clone())?;
    if secs == 0 || secs > max_s {
        return Err(form);
    }
    Ok(secs)
}

static PROTO_DURATION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([0-9]{1,12})(\.[0-9]{1,9})?s$").expect("static regex"));

/// Parses a proto3 JSON duration (`"14400s"`, `"0.5s"`) into seconds.
pub fn parse_proto_duration(value: &str) -> Result<f64, &'static str> {
    const FORM: &str = "a duration in seconds with the suffix s, e.g. \"14400s\"";
    let caps = PROTO_DURATION.captures(value).ok_or(FORM)?;
    let whole: f64 = caps[1].parse().map_err(|_| FORM)?;
    let frac: f64 = caps
        .get(2)
        .map(|m| format!("0{}", m.as_str()).parse().unwrap_or(0.0))
        .unwrap_or(0.0);
    Ok(whole + frac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_strings_follow_spark() {
        assert_eq!(parse_memory_mb("512m"), Ok(512));
        assert_eq!(parse_memory_mb("4g"), Ok(4096));
        assert_eq!(parse_memory_mb("4G"), Ok(4096));
        assert_eq!(parse_memory_mb("1024"), Ok(1024));
        assert_eq!(parse_memory_mb("2048k"), Ok(2));
        for bad in ["", "g", "4 g", "-1g", "1.5g", "4x", "99999999999999999999"] {
            assert!(parse_memory_mb(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_are_gigabytes() {
        assert_eq!(parse_size_gb("375g"), Ok(375));
        assert!(parse_size_gb("375").is_err());
        assert!(parse_size_gb("1t").is_err());
    }

    #[test]
    fn allocation_timeouts_are_whole_seconds_in_range() {
        assert_eq!(parse_allocation_timeout("1800s", 7200), Ok(1800));
        assert_eq!(parse_allocation_timeout("1s", 7200), Ok(1));
        assert_eq!(parse_allocation_timeout("7200s", 7200), Ok(7200));
        for bad in [
            "3600", "3600.5s", "-1s", "0s", "7201s", "1e3s", "3600S", " 60s", "s", "",
        ] {
            let err = parse_allocation_timeout(bad, 7200).expect_err(bad);
            assert!(err.contains("\"7200s\""), "{err}");
        }
        assert!(parse_allocation_timeout("3601s", 3600).is_err());
    }

    #[test]
    fn proto_durations_allow_fractions() {
        assert_eq!(parse_proto_duration("14400s"), Ok(14400.0));
        assert_eq!(parse_proto_duration("0.5s"), Ok(0.5));
        for bad in ["14400", "-1s", "1.s", "4h"] {
            assert!(parse_proto_duration(bad).is_err(), "{bad}");
        }
    }
}
