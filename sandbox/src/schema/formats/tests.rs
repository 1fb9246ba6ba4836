//! Each supported format with values Go's parsers accept and refuse (cases from kube-openapi's
//! `strfmt/default_test.go`, `date_test.go`, `time_test.go`, `duration_test.go` and Go's
//! `net`, `net/url` and `net/mail` tests).

use super::{supported, validates};

fn check(format: &str, valid: &[&str], invalid: &[&str]) {
    let name = supported(format).unwrap_or_else(|| panic!("{format} is supported"));
    for v in valid {
        assert!(validates(&name, v), "{format}: {v:?} should be valid");
    }
    for v in invalid {
        assert!(!validates(&name, v), "{format}: {v:?} should be invalid");
    }
}

#[test]
fn unsupported_formats_are_ignored_and_dashes_do_not_count() {
    assert_eq!(supported("date-time").as_deref(), Some("datetime"));
    assert_eq!(supported("int32"), None);
    assert_eq!(supported("int-or-string"), None);
    assert_eq!(supported("ip"), None);
}

#[test]
fn ipv4_is_parsed_sloppily_and_needs_a_dot() {
    check(
        "ipv4",
        &[
            "1.2.3.4",
            "0.0.0.0",
            "255.255.255.255",
            "010.001.0.1",
            "::ffff:1.2.3.4",
        ],
        &[
            "1.2.3.4:8080",
            "256.0.0.1",
            "1.2.3",
            "1.2.3.4.5",
            "::1",
            "",
            "a.b.c.d",
            "1.2.3.4/32",
        ],
    );
}

#[test]
fn ipv6_is_parsed_strictly_and_needs_a_colon() {
    check(
        "ipv6",
        &[
            "::1",
            "::",
            "128::1",
            "2001:db8::8a2e:370:7334",
            "1:2:3:4:5:6:7:8",
            "::ffff:1.2.3.4",
            "1:2:3:4:5:6:1.2.3.4",
        ],
        &[
            "1.2.3.4",
            "1:2:3:4:5:6:7:8:9",
            "1::2::3",
            "12345::1",
            "fe80::1%eth0",
            "::ffff:01.2.3.4",
            ":1",
            "1:",
            "1:2:3:4:5:6:7::8:9",
            "g::1",
        ],
    );
}

#[test]
fn cidr_takes_a_prefix_that_fits_the_address() {
    check(
        "cidr",
        &[
            "10.0.0.0/8",
            "1.2.3.4/32",
            "::/0",
            "2001:db8::/128",
            "010.0.0.0/8",
        ],
        &[
            "10.0.0.0",
            "1.2.3.4/33",
            "::/129",
            "1.2.3.4/",
            "1.2.3.4/a",
            "/8",
        ],
    );
}

#[test]
fn date_time_follows_strfmt() {
    check(
        "date-time",
        &[
            "2014-12-15T19:30:20.000Z",
            "2014-12-15t19:30:20z",
            "2014-12-15T19:30:20+01:00",
            "2024-02-29T00:00:00Z",
        ],
        &[
            "2014-12-15 19:30:20Z",
            "2014-12-15T24:00:00Z",
            "2014-12-15T19:30:20",
            "2023-02-29T00:00:00Z",
            "x",
            "2014-12-15T19:60:00Z",
        ],
    );
}

#[test]
fn date_is_a_full_date() {
    check(
        "date",
        &["2006-01-02", "2024-02-29", "0001-12-31"],
        &[
            "2006-1-2",
            "2006-13-01",
            "2023-02-29",
            "2006-01-32",
            "06-01-02",
            "2006-01-02T00:00:00Z",
        ],
    );
}

#[test]
fn byte_is_standard_base64() {
    check(
        "byte",
        &["aGVsbG8=", "aGVsbG8h", "YQ=="],
        &["aGVsbG8", "a", "aGVs bG8=", "aGVsbG8_", "", "===="],
    );
}

#[test]
fn uuids_allow_uppercase_and_missing_dashes() {
    check(
        "uuid",
        &[
            "a8098c1a-f86e-11da-bd1a-00112444be1e",
            "A8098C1AF86E11DABD1A00112444BE1E",
        ],
        &[
            "a8098c1a-f86e-11da-bd1a-00112444be1",
            "g8098c1a-f86e-11da-bd1a-00112444be1e",
            "",
        ],
    );
    check(
        "uuid3",
        &["bcd02e22-68f0-3046-a512-327cca9def8f"],
        &["a8098c1a-f86e-11da-bd1a-00112444be1e"],
    );
    check(
        "uuid4",
        &["025b0d74-00a2-4048-bf57-227c5111bb34"],
        &["025b0d74-00a2-4048-cf57-227c5111bb34"],
    );
    check(
        "uuid5",
        &["886313e1-3b8a-5372-9b90-0c9aee199e5d"],
        &["886313e1-3b8a-4372-9b90-0c9aee199e5d"],
    );
}

#[test]
fn hostname_follows_strfmt() {
    check(
        "hostname",
        &[
            "somewhere.com",
            "a",
            "x.y.example.org",
            "localhost",
            "Ω.example.com",
        ],
        &[
            "-a.example.com",
            "a..b",
            "somewhere.com.",
            "a_b.example.com",
            "",
            &"a".repeat(64),
        ],
    );
}

#[test]
fn email_is_one_mailbox() {
    check(
        "email",
        &[
            "me@example.com",
            "me.too@example.com",
            "\"quoted name\"@example.com",
            "Me <me@example.com>",
            "me@[127.0.0.1]",
            " me@example.com ",
        ],
        &[
            "me",
            "me@",
            "@example.com",
            "me..too@example.com",
            ".me@example.com",
            "me@example..com",
            "Me",
            "a@b, c@d",
            "me@example.com>",
        ],
    );
}

#[test]
fn uri_is_a_request_uri() {
    check(
        "uri",
        &[
            "http://example.com/path?q=1",
            "/relative/path",
            "*",
            "mailto:me@example.com",
            "https://user:pw@host:8443/",
            "http://[::1]:80/",
            "urn:isbn:0451450523",
        ],
        &[
            "",
            "relative/path",
            ":missing-scheme",
            "http://host:port/",
            "http://exa mple.com/",
            "/bad%zzescape",
            "http://[::1/",
            "a\u{7f}b",
        ],
    );
}

#[test]
fn mac_takes_the_three_forms_go_does() {
    check(
        "mac",
        &[
            "00:00:5e:00:53:01",
            "00-00-5e-00-53-01",
            "0000.5e00.5301",
            "02:00:5e:10:00:00:00:01",
        ],
        &[
            "00:00:5e:00:53",
            "00:00:5e-00:53:01",
            "0000.5e00.530",
            "00:00:5e:00:53:0g",
        ],
    );
}

#[test]
fn durations_take_go_syntax_and_words() {
    check(
        "duration",
        &[
            "1h",
            "1h30m",
            "0",
            "-1.5h",
            ".5s",
            "1μs",
            "3 days",
            "5 minutes",
            "1 second",
            "2 weeks",
        ],
        &["", "1", "1x", "h", "abc", "1.s.", "."],
    );
}

#[test]
fn the_remaining_formats() {
    check(
        "bsonobjectid",
        &["507f1f77bcf86cd799439011"],
        &["507f1f77bcf86cd79943901", "507f1f77bcf86cd79943901z"],
    );
    check(
        "isbn10",
        &["0321751043", "0-321-75104-3", "080442957X"],
        &["0321751044", "032175104"],
    );
    check(
        "isbn13",
        &["978-0321751041", "9780321751041"],
        &["9780321751042", "978032175104"],
    );
    check("isbn", &["0321751043", "978-0321751041"], &["1234"]);
    check(
        "creditcard",
        &["4111111111111111", "4111-1111-1111-1111"],
        &["4111111111111112", "1234"],
    );
    check(
        "ssn",
        &["111-11-1111", "111 11 1111"],
        &["11111111", "111-111-111", "111111111"],
    );
    check(
        "hexcolor",
        &["#FFFFFF", "fff", "#a0b1c2"],
        &["#ggg", "#ffff"],
    );
    check(
        "rgbcolor",
        &["rgb(255,255,255)", "rgb( 0 , 10 , 200 )"],
        &["rgb(256,0,0)", "rgb(1,2)", "rgba(1,2,3,4)"],
    );
    check("password", &["", "anything"], &[]);
}
