//! The network formats, as Go parses them: `net.ParseIP` (strict, `netip.ParseAddr`) for
//! `ipv6`; k8s.io/utils `ParseIPSloppy`/`ParseCIDRSloppy` (Go 1.16's parser, which allows
//! leading zeros) for `ipv4` and `cidr`; `net.ParseMAC`; `net/url.ParseRequestURI`;
//! `net/mail.ParseAddress`; and `strfmt.IsHostname`.

use std::sync::LazyLock;

use regex::Regex;

/// An IPv4 address of four decimal fields up to 255; `sloppy` allows leading zeros.
fn parse_ipv4(s: &str, sloppy: bool) -> bool {
    let fields: Vec<&str> = s.split('.').collect();
    fields.len() == 4
        && fields.iter().all(|f| {
            !f.is_empty()
                && f.bytes().all(|b| b.is_ascii_digit())
                && (sloppy || f.len() == 1 || !f.starts_with('0'))
                && f.parse::<u32>().is_ok_and(|n| n <= 255)
        })
}

/// An IPv6 address (no zone): hex groups separated by `:`, at most one `::` standing for at
/// least one zero group, and optionally a trailing IPv4 address in place of the last two.
/// The strict parser allows at most four hex digits per group; the sloppy (Go 1.16) one any
/// count whose value fits, and leading zeros in the IPv4 part.
fn parse_ipv6(s: &str, sloppy: bool) -> bool {
    let mut rest = s;
    let mut ellipsis = false;
    let mut groups = 0usize;
    if let Some(r) = rest.strip_prefix("::") {
        ellipsis = true;
        rest = r;
        if rest.is_empty() {
            return true;
        }
    }
    while groups < 8 {
        let hex = rest.bytes().take_while(u8::is_ascii_hexdigit).count();
        if hex == 0 || (!sloppy && hex > 4) {
            return false;
        }
        if rest[hex..].starts_with('.') {
            // A trailing IPv4 address takes the place of two groups.
            if (!ellipsis && groups != 6) || groups + 2 > 8 || !parse_ipv4(rest, sloppy) {
                return false;
            }
            groups += 2;
            rest = "";
            break;
        }
        if u32::from_str_radix(&rest[..hex], 16).map_or(true, |n| n > 0xFFFF) {
            return false;
        }
        groups += 1;
        rest = &rest[hex..];
        if rest.is_empty() {
            break;
        }
        if !rest.starts_with(':') || rest.len() == 1 {
            return false;
        }
        rest = &rest[1..];
        if let Some(r) = rest.strip_prefix(':') {
            if ellipsis {
                return false;
            }
            ellipsis = true;
            rest = r;
            if rest.is_empty() {
                break;
            }
        }
    }
    rest.is_empty() && (if ellipsis { groups < 8 } else { groups == 8 })
}

/// `net.ParseIP` (strict) or `ParseIPSloppy`: IPv4 when a `.` comes before any `:`.
pub(super) fn parse_ip(s: &str, sloppy: bool) -> bool {
    match s.bytes().find(|b| matches!(b, b'.' | b':')) {
        Some(b'.') => parse_ipv4(s, sloppy),
        Some(_) => parse_ipv6(s, sloppy),
        None => false,
    }
}

/// `ParseCIDRSloppy`: an address (IPv4 tried first), `/`, and a decimal prefix length that
/// fits the address.
pub(super) fn is_cidr(s: &str) -> bool {
    let Some((addr, mask)) = s.split_once('/') else {
        return false;
    };
    let bits = if parse_ipv4(addr, true) {
        32
    } else if parse_ipv6(addr, true) {
        128
    } else {
        return false;
    };
    !mask.is_empty()
        && mask.bytes().all(|b| b.is_ascii_digit())
        && mask.parse::<u32>().is_ok_and(|n| n <= bits)
}

/// `net.ParseMAC`: 6, 8 or 20 octets as two hex digits separated by `:` or `-` throughout, or
/// groups of four hex digits separated by `.`.
pub(super) fn is_mac(s: &str) -> bool {
    if s.len() < 14 {
        return false;
    }
    let hex = |part: &str, n: usize| part.len() == n && part.bytes().all(|b| b.is_ascii_hexdigit());
    let sep = s.as_bytes()[2];
    if sep == b':' || sep == b'-' {
        let parts: Vec<&str> = s.split(char::from(sep)).collect();
        matches!(parts.len(), 6 | 8 | 20) && parts.iter().all(|p| hex(p, 2))
    } else if s.as_bytes()[4] == b'.' {
        let parts: Vec<&str> = s.split('.').collect();
        matches!(parts.len() * 2, 6 | 8 | 20) && parts.iter().all(|p| hex(p, 4))
    } else {
        false
    }
}

static HOSTNAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^([a-zA-Z0-9\p{S}\p{L}]((-?[a-zA-Z0-9\p{S}\p{L}]{0,62})?)|([a-zA-Z0-9\p{S}\p{L}](([a-zA-Z0-9-\p{S}\p{L}]{0,61}[a-zA-Z0-9\p{S}\p{L}])?)(\.)){1,}([a-zA-Z\p{L}]){2,63})$")
        .expect("the hostname pattern compiles")
});

/// `strfmt.IsHostname`: the pattern, at most 255 bytes, labels of at most 63 bytes.
pub(super) fn is_hostname(s: &str) -> bool {
    HOSTNAME.is_match(s) && s.len() <= 255 && s.split('.').all(|p| p.len() <= 63)
}

/// Whether `s` holds a `%` not followed by two hex digits (`url.unescape`), or, in a host,
/// a character `net/url` would have to escape.
fn bad_escapes(s: &str, host: bool) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if i + 2 >= b.len() || !(b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit()) {
                return true;
            }
            // In a host only non-ASCII bytes may be escaped, and `%25` (RFC 6874 zones).
            if host && b[i + 1] < b'8' && &s[i..i + 3] != "%25" {
                return true;
            }
            i += 3;
        } else {
            if host && b[i] < 0x80 && !host_char(b[i]) {
                return true;
            }
            i += 1;
        }
    }
    false
}

/// What `net/url` leaves unescaped in a host (`shouldEscape` with `encodeHost`).
fn host_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:[]<>\"".contains(&c)
}

/// `url.ParseRequestURI`: no control bytes; `*`; or a scheme followed by anything not starting
/// with `/` (opaque), or a path starting with `/` (with an authority after a scheme and `//`,
/// whose userinfo, host and port must be well-formed); `%` escapes must be complete.
pub(super) fn is_request_uri(s: &str) -> bool {
    if s.is_empty() || s.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return false;
    }
    if s == "*" {
        return true;
    }
    let mut scheme = "";
    let mut rest = s;
    for (i, c) in s.char_indices() {
        match c {
            'a'..='z' | 'A'..='Z' => {}
            '0'..='9' | '+' | '-' | '.' if i > 0 => {}
            ':' if i == 0 => return false,
            ':' => {
                scheme = &s[..i];
                rest = &s[i + 1..];
                break;
            }
            _ => break,
        }
    }
    rest = if rest.ends_with('?') && rest.matches('?').count() == 1 {
        &rest[..rest.len() - 1]
    } else {
        rest.split_once('?').map_or(rest, |(path, _)| path)
    };
    if !rest.starts_with('/') {
        return !scheme.is_empty();
    }
    if !scheme.is_empty()
        && let Some(after) = rest.strip_prefix("//")
    {
        let end = after.find('/').unwrap_or(after.len());
        let authority = &after[..end];
        rest = &after[end..];
        let host = match authority.rfind('@') {
            Some(at) => {
                let user = &authority[..at];
                let user_ok = user
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"-._:~!$&'()*+,;=%@".contains(&c));
                if !user_ok || bad_escapes(user, false) {
                    return false;
                }
                &authority[at + 1..]
            }
            None => authority,
        };
        let port_ok = |p: &str| {
            p.is_empty()
                || p.strip_prefix(':')
                    .is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit()))
        };
        if host.starts_with('[') {
            let Some(close) = host.rfind(']') else {
                return false;
            };
            if !port_ok(&host[close + 1..]) {
                return false;
            }
        } else if let Some(colon) = host.rfind(':')
            && !port_ok(&host[colon..])
        {
            return false;
        }
        if bad_escapes(host, true) {
            return false;
        }
    }
    !bad_escapes(rest, false)
}

/// `net/mail`'s atext, with `.` when `dot`: printable ASCII but specials, and any non-ASCII.
fn atext(c: char, dot: bool) -> bool {
    match c {
        '.' => dot,
        '(' | ')' | '<' | '>' | '[' | ']' | ':' | ';' | '@' | '\\' | ',' | '"' => false,
        c => ('!'..='~').contains(&c) || !c.is_ascii(),
    }
}

/// A dot-atom at the start of `s` (no leading, trailing or double dot); the rest after it.
fn dot_atom(s: &str) -> Option<&str> {
    let end = s.find(|c| !atext(c, true)).unwrap_or(s.len());
    let atom = &s[..end];
    let ok =
        !atom.is_empty() && !atom.starts_with('.') && !atom.ends_with('.') && !atom.contains("..");
    ok.then_some(&s[end..])
}

/// A quoted string at the start of `s` (with `\` escapes); the rest after it, and whether it
/// held anything.
fn quoted(s: &str) -> Option<(&str, bool)> {
    let mut chars = s.strip_prefix('"')?.char_indices();
    let mut empty = true;
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((&s[i + 2..], !empty)),
            '\\' => {
                chars.next()?;
            }
            c if c != ' ' && c != '\t' && !('!'..='~').contains(&c) && c.is_ascii() => {
                return None;
            }
            _ => {}
        }
        empty = false;
    }
    None
}

/// An addr-spec at the start of `s`: a dot-atom or non-empty quoted local part, `@`, and a
/// dot-atom or bracketed domain; the rest after it.
fn addr_spec(s: &str) -> Option<&str> {
    let s = s.trim_start_matches([' ', '\t']);
    let rest = if s.starts_with('"') {
        match quoted(s)? {
            (rest, true) => rest,
            (_, false) => return None,
        }
    } else {
        dot_atom(s)?
    };
    let domain = rest.strip_prefix('@')?.trim_start_matches([' ', '\t']);
    if let Some(literal) = domain.strip_prefix('[') {
        let close = literal.find(']')?;
        let inner = &literal[..close];
        inner
            .chars()
            .all(|c| c != '[' && c != '\\' && (('!'..='~').contains(&c) || c == ' ' || c == '\t'))
            .then_some(&literal[close + 1..])
    } else {
        dot_atom(domain)
    }
}

/// `mail.ParseAddress` for one mailbox: an addr-spec, or a display name of words followed by
/// `<addr-spec>`, with surrounding blanks. Comments and groups are not read.
pub(super) fn is_email(s: &str) -> bool {
    let blank = |r: &str| r.trim_matches([' ', '\t']).is_empty();
    let s = s.trim_start_matches([' ', '\t']);
    if addr_spec(s).is_some_and(blank) {
        return true;
    }
    let Some(open) = s.find('<') else {
        return false;
    };
    let mut name = s[..open].trim_matches([' ', '\t']);
    while !name.is_empty() {
        name = if name.starts_with('"') {
            match quoted(name) {
                Some((rest, _)) => rest,
                None => return false,
            }
        } else {
            let end = name.find(|c| !atext(c, true)).unwrap_or(name.len());
            if end == 0 {
                return false;
            }
            &name[end..]
        }
        .trim_start_matches([' ', '\t']);
    }
    addr_spec(&s[open + 1..])
        .and_then(|rest| rest.strip_prefix('>'))
        .is_some_and(blank)
}
