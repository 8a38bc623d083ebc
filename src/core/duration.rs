//! Durations as Kubernetes writes them: Go's `time.Duration` text, in a
//! `KubeProxyConfiguration`, in flags and in annotations.

use std::time::Duration;

/// A duration as Go prints one (`30s`, `1m30s`, `1h0m0s`, `500ms`), the form
/// of every duration in a `KubeProxyConfiguration`; `parse_duration` reads it.
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let seconds = |ms: u128| match ms % 1000 {
        0 => format!("{}s", ms / 1000),
        frac => format!(
            "{}.{}s",
            ms / 1000,
            format!("{frac:03}").trim_end_matches('0')
        ),
    };
    let (h, m) = (ms / 3_600_000, (ms / 60_000) % 60);
    let s = seconds(ms % 60_000);
    match (h, m) {
        (0, 0) => s,
        (0, m) => format!("{m}m{s}"),
        (h, m) => format!("{h}h{m}m{s}"),
    }
}

/// Parses a Go duration as Kubernetes writes them (`30s`, `1m30s`, `500ms`, `2h`),
/// or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (like 30s, 500ms, 1m30s)");
    // Go's durations are int64 nanoseconds: about 292 years at most.
    let in_range = |secs: f64| {
        if secs.is_nan() || secs < 0.0 {
            return Err(bad());
        }
        Duration::try_from_secs_f64(secs)
            .ok()
            .filter(|d| d.as_nanos() <= i64::MAX as u128)
            .ok_or_else(|| format!("{s:?} is too long for a duration (2562047h47m16s at most)"))
    };
    let text = s.trim();
    if let Ok(secs) = text.parse::<f64>() {
        return in_range(secs);
    }
    let mut rest = text;
    let mut total = 0.0;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        let n: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            unit => {
                return Err(format!(
                    "{s:?}: unknown unit {unit:?} (ns, us, ms, s, m, h)"
                ))
            }
        };
        total += n * scale;
        rest = &rest[unit_len..];
    }
    in_range(total)
}
