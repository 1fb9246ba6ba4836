//! The string formats kube-apiserver 1.33 checks in custom resources: the formats apiextensions
//! supports (`pkg/apiserver/validation/formats.go`, `supportedVersionedFormats`; any other
//! `format` is stripped from the schema and never checked), each validated as kube-openapi's
//! `strfmt` registry does (`pkg/validation/strfmt/default.go`, `date.go`, `time.go`,
//! `duration.go`, `bson.go`). Names are compared without dashes, as the registry's
//! `DefaultNameNormalizer` does, so `date-time` is `datetime`.

mod net;
#[cfg(test)]
mod tests;

use std::sync::LazyLock;

use regex::Regex;

/// The supported format `name` names, normalized; None for formats the API server ignores.
pub(super) fn supported(name: &str) -> Option<String> {
    const SUPPORTED: [&str; 24] = [
        "bsonobjectid",
        "uri",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "cidr",
        "mac",
        "uuid",
        "uuid3",
        "uuid4",
        "uuid5",
        "isbn",
        "isbn10",
        "isbn13",
        "creditcard",
        "ssn",
        "hexcolor",
        "rgbcolor",
        "byte",
        "password",
        "date",
        "duration",
        "datetime",
    ];
    let normalized = name.replace('-', "");
    SUPPORTED
        .contains(&normalized.as_str())
        .then_some(normalized)
}

/// Whether `value` is valid for the supported format `normalized` (see [`supported`]).
pub(super) fn validates(normalized: &str, value: &str) -> bool {
    match normalized {
        "bsonobjectid" => value.len() == 24 && value.bytes().all(|b| b.is_ascii_hexdigit()),
        "uri" => net::is_request_uri(value),
        "email" => net::is_email(value),
        "hostname" => net::is_hostname(value),
        "ipv4" => net::parse_ip(value, true) && value.contains('.'),
        "ipv6" => net::parse_ip(value, false) && value.contains(':'),
        "cidr" => net::is_cidr(value),
        "mac" => net::is_mac(value),
        "uuid" => matches(&UUID, value),
        "uuid3" => matches(&UUID3, value),
        "uuid4" => matches(&UUID4, value),
        "uuid5" => matches(&UUID5, value),
        "isbn" => is_isbn10(value) || is_isbn13(value),
        "isbn10" => is_isbn10(value),
        "isbn13" => is_isbn13(value),
        "creditcard" => is_credit_card(value),
        "ssn" => value.len() == 11 && matches(&SSN, value),
        "hexcolor" => matches(&HEX_COLOR, value),
        "rgbcolor" => matches(&RGB_COLOR, value),
        "byte" => matches(&BASE64, value),
        "password" => true,
        "date" => is_date(value),
        "duration" => is_duration(value),
        "datetime" => is_date_time(value),
        _ => true,
    }
}

fn regex(pattern: &str) -> Regex {
    // The patterns are constants that compile; a failure is a bug caught by every test.
    Regex::new(pattern).expect("format pattern compiles")
}

fn matches(re: &LazyLock<Regex>, value: &str) -> bool {
    re.is_match(value)
}

// Patterns of kube-openapi's `strfmt` and its vendored govalidator, with Go's ASCII `\d`/`\s`.
static UUID: LazyLock<Regex> = LazyLock::new(|| {
    regex("(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
});
static UUID3: LazyLock<Regex> = LazyLock::new(|| {
    regex("(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
});
static UUID4: LazyLock<Regex> = LazyLock::new(|| {
    regex("(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$")
});
static UUID5: LazyLock<Regex> = LazyLock::new(|| {
    regex("(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$")
});
static SSN: LazyLock<Regex> = LazyLock::new(|| regex(r"^[0-9]{3}[- ]?[0-9]{2}[- ]?[0-9]{4}$"));
static HEX_COLOR: LazyLock<Regex> = LazyLock::new(|| regex("^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$"));
static RGB_COLOR: LazyLock<Regex> = LazyLock::new(|| {
    let n = r"[\t\n\x0C\r ]*(0|[1-9][0-9]?|1[0-9][0-9]?|2[0-4][0-9]|25[0-5])[\t\n\x0C\r ]*";
    regex(&format!(r"^rgb\({n},{n},{n}\)$"))
});
static BASE64: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$")
});
static CREDIT_CARD: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        "^(?:4[0-9]{12}(?:[0-9]{3})?|5[1-5][0-9]{14}|6(?:011|5[0-9][0-9])[0-9]{12}|3[47][0-9]{13}|3(?:0[0-5]|[68][0-9])[0-9]{11}|(?:2131|1800|35[0-9]{3})[0-9]{11})$",
    )
});
static DATE_TIME_CLOCK: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$")
});
static DURATION_TERM: LazyLock<Regex> =
    LazyLock::new(|| regex(r"([0-9]+)[\t\n\x0C\r ]*([A-Za-zµ]+)"));

/// govalidator's ISBN checks strip whitespace and dashes first.
fn isbn_digits(value: &str) -> Vec<u8> {
    value
        .bytes()
        .filter(|b| !matches!(b, b'\t' | b'\n' | b'\x0C' | b'\r' | b' ' | b'-'))
        .collect()
}

fn is_isbn10(value: &str) -> bool {
    let s = isbn_digits(value);
    let shape = s.len() == 10
        && s[..9].iter().all(u8::is_ascii_digit)
        && (s[9].is_ascii_digit() || s[9] == b'X');
    if !shape {
        return false;
    }
    let mut sum: u32 = (0..9)
        .map(|i| (i as u32 + 1) * u32::from(s[i] - b'0'))
        .sum();
    sum += 10
        * if s[9] == b'X' {
            10
        } else {
            u32::from(s[9] - b'0')
        };
    sum.is_multiple_of(11)
}

fn is_isbn13(value: &str) -> bool {
    let s = isbn_digits(value);
    if s.len() != 13 || !s.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let sum: u32 = (0..12)
        .map(|i| [1, 3][i % 2] * u32::from(s[i] - b'0'))
        .sum();
    u32::from(s[12] - b'0') == (10 - sum % 10) % 10
}

/// govalidator's `IsCreditCard`: the digits (everything else dropped) match a card pattern and
/// pass the Luhn check.
fn is_credit_card(value: &str) -> bool {
    let digits: String = value.chars().filter(char::is_ascii_digit).collect();
    if !CREDIT_CARD.is_match(&digits) {
        return false;
    }
    let sum: u32 = digits
        .bytes()
        .rev()
        .enumerate()
        .map(|(i, b)| {
            let d = u32::from(b - b'0');
            match (i % 2 == 1, d * 2) {
                (true, doubled) if doubled >= 10 => doubled % 10 + 1,
                (true, doubled) => doubled,
                (false, _) => d,
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// Go's `time.Parse` with strfmt's `RFC3339FullDate` layout: four-digit year, two-digit month
/// and day, the day within its month.
fn is_date(value: &str) -> bool {
    let b = value.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        b[r].iter().try_fold(0u32, |n, c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let (Some(year), Some(month), Some(day)) = (digits(0..4), digits(5..7), digits(8..10)) else {
        return false;
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

/// `strfmt.IsDateTime`: split at `t` (case-insensitive), a date before it and a clock after it
/// (only the first two pieces are looked at), with hours, minutes and seconds compared as text.
fn is_date_time(value: &str) -> bool {
    if value.len() < 4 {
        return false;
    }
    let lower = value.to_lowercase();
    let mut parts = lower.split('t');
    let (Some(date), Some(clock)) = (parts.next(), parts.next()) else {
        return false;
    };
    if !is_date(date) {
        return false;
    }
    let Some(m) = DATE_TIME_CLOCK.captures(clock) else {
        return false;
    };
    &m[1] <= "23" && &m[2] <= "59" && &m[3] <= "59"
}

/// `strfmt.ParseDuration`: Go's `time.ParseDuration`, else any `<digits><unit>` term whose
/// unit names one of the registry's (`3 days`, `5 minutes`).
fn is_duration(value: &str) -> bool {
    const UNITS: [&[&str]; 8] = [
        &["ns", "nano"],
        &["us", "µs", "micro"],
        &["ms", "milli"],
        &["s", "sec"],
        &["m", "min"],
        &["h", "hr", "hour"],
        &["d", "day"],
        &["w", "wk", "week"],
    ];
    if is_go_duration(value) {
        return true;
    }
    let mut ok = false;
    for m in DURATION_TERM.captures_iter(value) {
        // `strconv.Atoi` failing on a term fails the whole value.
        if m[1].parse::<i64>().is_err() {
            return false;
        }
        let unit = m[2].to_lowercase();
        ok |= UNITS.iter().any(|variants| {
            let last = variants.len() - 1;
            variants
                .iter()
                .enumerate()
                .any(|(i, v)| (i == last && unit.starts_with(v)) || unit.eq_ignore_ascii_case(v))
        });
    }
    ok
}

/// Go's `time.ParseDuration` syntax: an optional sign, then numbers with units
/// (`ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`), or `0`.
fn is_go_duration(value: &str) -> bool {
    let s = value.strip_prefix(['-', '+']).unwrap_or(value);
    if s == "0" {
        return true;
    }
    if s.is_empty() {
        return false;
    }
    let mut rest = s;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let mut after = &rest[int_len..];
        if let Some(f) = after.strip_prefix('.') {
            let frac_len = f.bytes().take_while(u8::is_ascii_digit).count();
            after = &f[frac_len..];
            if int_len == 0 && frac_len == 0 {
                return false;
            }
        } else if int_len == 0 {
            return false;
        }
        let unit_len = after
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(after.len(), |(i, _)| i);
        if !["ns", "us", "µs", "μs", "ms", "s", "m", "h"].contains(&&after[..unit_len]) {
            return false;
        }
        rest = &after[unit_len..];
    }
    true
}
