//! OCI image references split and checked per the distribution spec's grammar,
//! `[domain[:port]/]path[:tag][@algorithm:encoded]`, with one precise message per part.

/// Longest repository name (domain and path) the distribution spec allows.
pub const MAX_IMAGE_NAME_LEN: usize = 255;

/// An image reference split per the distribution spec's grammar:
/// `[domain[:port]/]path[:tag][@algorithm:encoded]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageRef<'a> {
    /// Registry host and optional port, when the reference names one.
    pub domain: Option<&'a str>,
    /// Repository path, `/`-separated lower-case components.
    pub path: &'a str,
    /// Tag, when given.
    pub tag: Option<&'a str>,
    /// Digest, `algorithm:encoded`, when given.
    pub digest: Option<&'a str>,
}

impl<'a> ImageRef<'a> {
    /// Parses `reference`, or says precisely what is wrong with it.
    pub fn parse(reference: &'a str) -> Result<Self, String> {
        let (rest, digest) = match reference.split_once('@') {
            Some((rest, digest)) => (rest, Some(digest)),
            None => (reference, None),
        };
        if let Some(digest) = digest {
            check_digest(digest)?;
        }
        // A ':' after the last '/' starts the tag; one before it is a registry port.
        let (name, tag) = match rest.rfind(':') {
            Some(colon) if rest.rfind('/').is_none_or(|slash| colon > slash) => {
                (&rest[..colon], Some(&rest[colon + 1..]))
            }
            _ => (rest, None),
        };
        if let Some(tag) = tag {
            check_tag(tag)?;
        }
        if name.is_empty() {
            return Err("the repository name is empty".to_owned());
        }
        if name.len() > MAX_IMAGE_NAME_LEN {
            return Err(format!(
                "the repository name may be at most {MAX_IMAGE_NAME_LEN} characters"
            ));
        }
        // As Docker decides: the first component is a registry if it looks like a host.
        let (domain, path) = match name.split_once('/') {
            Some((first, path))
                if first.contains(['.', ':'])
                    || first == "localhost"
                    || first.bytes().any(|b| b.is_ascii_uppercase()) =>
            {
                (Some(first), path)
            }
            _ => (None, name),
        };
        if let Some(domain) = domain {
            check_domain(domain)?;
        }
        check_path(path)?;
        Ok(Self {
            domain,
            path,
            tag,
            digest,
        })
    }
}

fn check_domain(domain: &str) -> Result<(), String> {
    // A bracketed IPv6 literal holds colons of its own: the port follows its ']'.
    if let Some(literal) = domain.strip_prefix('[') {
        let (address, rest) = literal
            .split_once(']')
            .ok_or_else(|| format!("registry host {domain:?} opens '[' without closing it"))?;
        check_ipv6(address)?;
        return match rest {
            "" => Ok(()),
            _ => match rest.strip_prefix(':') {
                Some(port) => check_port(port),
                None => Err(format!(
                    "registry host [{address}] must be followed by ':' and a port, or by '/'"
                )),
            },
        };
    }
    let (host, port) = match domain.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (domain, None),
    };
    for label in host.split('.') {
        let bytes = label.as_bytes();
        let ok = !bytes.is_empty()
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
            && bytes[0] != b'-'
            && bytes[bytes.len() - 1] != b'-';
        if !ok {
            return Err(format!(
                "registry host {host:?} must be dot-separated labels of letters, digits and '-' \
                 (not at either end)"
            ));
        }
    }
    port.map_or(Ok(()), check_port)
}

fn check_port(port: &str) -> Result<(), String> {
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("registry port {port:?} must be digits"));
    }
    Ok(())
}

/// The grammar's `[` hex digits and colons `]`, which must also be an IPv6 address (stricter
/// than the schema, whose pattern only asks for a colon in it).
fn check_ipv6(address: &str) -> Result<(), String> {
    let grammar = address.bytes().all(|b| b.is_ascii_hexdigit() || b == b':');
    if !grammar || address.parse::<std::net::Ipv6Addr>().is_err() {
        return Err(format!(
            "registry host [{address}] is not an IPv6 address (hex digits and colons, such as [::1] or [2001:db8::5])"
        ));
    }
    Ok(())
}

fn check_path(path: &str) -> Result<(), String> {
    for component in path.split('/') {
        if component.is_empty() {
            return Err("the repository path has an empty component".to_owned());
        }
        if !path_component_ok(component.as_bytes()) {
            return Err(format!(
                "repository path component {component:?} must be lower-case letters and digits, \
                 separated by '.', '_', '__' or dashes"
            ));
        }
    }
    Ok(())
}

/// `[a-z0-9]+(([._]|__|[-]+)[a-z0-9]+)*`
fn path_component_ok(bytes: &[u8]) -> bool {
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut i = 0;
    loop {
        let start = i;
        while i < bytes.len() && alnum(&bytes[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == bytes.len() {
            return true;
        }
        let sep = i;
        while i < bytes.len() && !alnum(&bytes[i]) {
            i += 1;
        }
        let separator = &bytes[sep..i];
        let ok = matches!(separator, b"." | b"_" | b"__") || separator.iter().all(|b| *b == b'-');
        if !ok {
            return false;
        }
    }
}

fn check_tag(tag: &str) -> Result<(), String> {
    let bytes = tag.as_bytes();
    let word = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_';
    if bytes.is_empty() {
        return Err("the tag after ':' is empty".to_owned());
    }
    if bytes.len() > 128 {
        return Err("the tag may be at most 128 characters".to_owned());
    }
    if !word(&bytes[0]) || !bytes.iter().all(|b| word(b) || matches!(b, b'.' | b'-')) {
        return Err(format!(
            "tag {tag:?} must be letters, digits, '_', '.' and '-', not starting with '.' or '-'"
        ));
    }
    Ok(())
}

fn check_digest(digest: &str) -> Result<(), String> {
    let (algorithm, encoded) = digest
        .split_once(':')
        .ok_or_else(|| format!("digest {digest:?} must be algorithm:encoded"))?;
    let component_ok = |c: &str| {
        !c.is_empty()
            && c.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    if !algorithm.split(['+', '.', '_', '-']).all(component_ok) {
        return Err(format!("digest algorithm {algorithm:?} is not valid"));
    }
    let hex = |len: usize| {
        encoded.len() == len
            && encoded
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let ok = match algorithm {
        "sha256" => hex(64),
        "sha512" => hex(128),
        _ => {
            encoded.len() >= 32
                && encoded
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'=' | b'_' | b'-'))
        }
    };
    match (ok, algorithm) {
        (true, _) => Ok(()),
        // Only these two are the webhook's own rule (the schema asks any algorithm for 32).
        (false, "sha256" | "sha512") => Err(format!(
            "digest {digest:?} is not valid: sha256 needs 64 and sha512 128 lower-case hex digits"
        )),
        (false, _) => Err(format!(
            "digest {digest:?} is not valid: the encoded part needs at least 32 letters, digits, \
             '=', '_' or '-'"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_follow_the_distribution_grammar() {
        let digest = format!("sha256:{}", "a".repeat(64));
        for good in [
            "nginx",
            "nginx:1.27",
            "library/nginx",
            "localhost/app",
            "localhost:5000/app:dev",
            "registry.example.com:443/team/app__x/y-z:1.0_rc.1",
            "Registry.Example.com/app",
            "a--b/c.d",
            &format!("app@{digest}"),
            &format!("ghcr.io/x/app:1@{digest}"),
            &format!("app@sha512:{}", "0".repeat(128)),
            &format!("app@multihash+base58:{}", "Q".repeat(46)),
            "[::1]:5000/app:1",
            "[2001:DB8::5]/team/app",
            "a_b/c",
            "a.b/c",
        ] {
            assert!(
                ImageRef::parse(good).is_ok(),
                "{good}: {:?}",
                ImageRef::parse(good)
            );
        }
        for (bad, why) in [
            ("Nginx", "must be lower-case"),
            ("app:", "tag after ':' is empty"),
            ("app:-x", "tag \"-x\""),
            ("app/", "empty component"),
            ("/app", "empty component"),
            ("app..x", "must be lower-case"),
            ("-app", "must be lower-case"),
            ("reg-.io/app", "registry host"),
            ("reg.io:port/app", "port"),
            ("app@sha256:abc", "64"),
            ("app@sha256", "algorithm:encoded"),
            ("app@SHA256:abcdefabcdefabcdefabcdefabcdefab", "algorithm"),
            ("app with space", "must be lower-case"),
            ("a.b_c/app", "registry host \"a.b_c\""),
            ("[::1/app", "without closing"),
            ("[1]:5000/app", "not an IPv6 address"),
            ("[::1]5000/app", "followed by ':'"),
            ("[::1]:/app", "port"),
            ("[::ffff:1.2.3.4]/app", "not an IPv6 address"),
        ] {
            let error = ImageRef::parse(bad).unwrap_err();
            assert!(error.contains(why), "{bad}: {error}");
        }
        assert!(
            ImageRef::parse(&format!("r.io/{}", "a".repeat(252)))
                .unwrap_err()
                .contains("at most 255")
        );
    }

    #[test]
    fn image_parts_are_split_as_docker_does() {
        assert!(ImageRef::parse("localhost:5000/team/app:1.2@sha256:").is_err());
        let r = ImageRef::parse("localhost:5000/team/app:1.2").unwrap();
        assert_eq!(
            (r.domain, r.path, r.tag, r.digest),
            (Some("localhost:5000"), "team/app", Some("1.2"), None)
        );
        let r = ImageRef::parse("[::1]:5000/app:1").unwrap();
        assert_eq!(
            (r.domain, r.path, r.tag, r.digest),
            (Some("[::1]:5000"), "app", Some("1"), None)
        );
        let r = ImageRef::parse("team/app").unwrap();
        assert_eq!((r.domain, r.path, r.tag), (None, "team/app", None));
    }
}
