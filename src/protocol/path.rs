//! Request path normalisation: the path route matching sees is the path the upstream gets.
//! Pure: no I/O, unit-tested here.
//!
//! A route that does not match is the worst failure a dedupe gateway can have: nothing
//! looks wrong and the duplicate goes through. `//v1/payments/x`, `/v1/%70ayments/x` and
//! `/x/../v1/payments/x` all reach the upstream's `/v1/payments/x` handler, so they must
//! match its route too; and `/v1/payments/../x` must not be deduped as a payment while the
//! upstream acts on `/v1/x`. Hence RFC 3986 §6.2.2 normalisation (percent-encoded
//! unreserved characters decoded, the remaining escapes in uppercase, dot segments
//! removed) plus merging repeated slashes, and the result is what is forwarded. What
//! cannot be normalised without guessing how the upstream decodes it is refused: `%2F`,
//! `%5C` and `%00`, and a raw `\`, which some upstreams read as `/`.
//!
//! Bytes outside ASCII (raw UTF-8, as many clients send it) are forwarded as sent. Routes
//! and keys see them percent-encoded ([`match_form`]), so `/café` and `/caf%C3%A9`,
//! one path to any upstream that decodes, are one path to the routes too.

use std::borrow::Cow;

/// Why a path was refused (400 for the client).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `%2F`, `%5C` or `%00` inside a segment: upstreams disagree on whether it separates
    /// segments (or ends the string), so no normal form is safe.
    #[error(
        "the path contains {0}, which upstreams decode differently; send the segments unencoded"
    )]
    AmbiguousEscape(&'static str),
    /// A `%` not followed by two hex digits.
    #[error("the path has a malformed percent-escape")]
    MalformedEscape,
    /// `..` would climb above `/`.
    #[error("the path's dot segments climb above the root")]
    AboveRoot,
    /// A raw `\`: some upstreams read it as `/`, so no normal form is safe (as `%5C`).
    #[error("the path contains a backslash, which some upstreams read as '/'; send '/' or an escaped character")]
    Backslash,
}

/// The normal form of an origin-form path (without query). Paths that do not start with
/// `/` (`*` of `OPTIONS *`) are returned as they are: no route can match them.
///
/// - `%XX` of an unreserved character (`A-Z a-z 0-9 - . _ ~`) is decoded; every other
///   escape is kept with uppercase hex digits;
/// - `%2F` (`/`), `%5C` (`\`) and `%00` are refused, as are a raw `\` and a malformed
///   escape;
/// - every other byte, raw UTF-8 included, is kept as sent;
/// - runs of `/` become one `/`;
/// - `.` segments are removed and `..` removes the segment before it (RFC 3986 §5.2.4),
///   refused when nothing is left to remove. A trailing `.` or `..` leaves a trailing `/`.
pub fn normalise(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') || is_normal(path) {
        return Ok(Cow::Borrowed(path));
    }
    rebuild(path)
}

/// The normal form of a path starting with `/`, built segment by segment.
fn rebuild(path: &str) -> Result<Cow<'_, str>, PathError> {
    let mut segments: Vec<String> = Vec::new();
    let mut raw = path[1..].split('/').peekable();
    // Whether the output ends in `/` (a final empty, `.` or `..` segment).
    let mut trailing_slash = false;
    while let Some(raw_segment) = raw.next() {
        let last = raw.peek().is_none();
        let segment = decode_unreserved(raw_segment)?;
        match segment.as_str() {
            // An empty segment is a repeated (or the final) slash.
            "" => trailing_slash = last,
            "." => trailing_slash = last,
            ".." => {
                if segments.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                trailing_slash = last;
            }
            _ => {
                segments.push(segment);
                trailing_slash = false;
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if trailing_slash || segments.is_empty() {
        out.push('/');
    }
    Ok(if out == path {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(out)
    })
}

/// One segment with unreserved escapes decoded and the rest in uppercase. Built from
/// bytes: a raw UTF-8 character is copied byte for byte, never re-encoded.
/// Whether `path` (starting with `/`) is its own normal form, read in one pass without
/// allocating: no escape, no backslash, no empty segment but the last, no dot segment.
/// Most paths are; [`normalise`] builds the normal form only for the others.
fn is_normal(path: &str) -> bool {
    // One pass over the bytes (splitting at '/' as a `str` pattern cost five times as
    // much, twice a request): a percent sign or a backslash, an empty segment but the
    // last, or a dot segment anywhere is not normal.
    let body = &path.as_bytes()[1..];
    let mut start = 0;
    for (i, &b) in body.iter().enumerate() {
        match b {
            b'%' | b'\\' => return false,
            b'/' => {
                if matches!(&body[start..i], b"" | b"." | b"..") {
                    return false;
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    !matches!(&body[start..], b"." | b"..")
}

fn decode_unreserved(segment: &str) -> Result<String, PathError> {
    let bytes = segment.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(segment.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\\' {
            return Err(PathError::Backslash);
        }
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let hex = |j: usize| {
            bytes
                .get(j)
                .and_then(|&c| char::from(c).to_digit(16))
                .ok_or(PathError::MalformedEscape)
        };
        let octet = u8::try_from(hex(i + 1)? * 16 + hex(i + 2)?).unwrap_or(0);
        match octet {
            b'/' => return Err(PathError::AmbiguousEscape("%2F")),
            b'\\' => return Err(PathError::AmbiguousEscape("%5C")),
            0 => return Err(PathError::AmbiguousEscape("%00")),
            c if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') => out.push(c),
            c => push_escape(&mut out, c),
        }
        i += 3;
    }
    // Escapes and ASCII were replaced by ASCII, every other byte copied from valid UTF-8 at
    // character boundaries (a byte >= 0x80 is never `%` or `\`): still valid UTF-8.
    String::from_utf8(out).map_err(|_| PathError::MalformedEscape)
}

/// `%XX` in uppercase.
fn push_escape(out: &mut Vec<u8>, c: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.extend_from_slice(&[b'%', HEX[usize::from(c >> 4)], HEX[usize::from(c & 15)]]);
}

/// The form routes are matched in and keys read: a normal path with every byte outside
/// ASCII percent-encoded in uppercase. The upstream still gets the normal form as sent;
/// this only makes its two spellings of one character one path to the routes.
pub fn match_form(normal: &str) -> Cow<'_, str> {
    if normal.is_ascii() {
        return Cow::Borrowed(normal);
    }
    let mut out = Vec::with_capacity(normal.len() * 2);
    for &b in normal.as_bytes() {
        if b.is_ascii() {
            out.push(b);
        } else {
            push_escape(&mut out, b);
        }
    }
    // Only ASCII was written.
    Cow::Owned(String::from_utf8(out).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass reading agrees with the segment-by-segment one on every path of up to
    /// seven bytes over the bytes that matter, and a normal path rebuilds as itself.
    #[test]
    fn a_normal_path_is_found_in_one_pass() {
        fn by_segments(path: &str) -> bool {
            let body = &path[1..];
            if body.bytes().any(|b| b == b'%' || b == b'\\') {
                return false;
            }
            let mut segments = body.split('/').peekable();
            while let Some(segment) = segments.next() {
                let last = segments.peek().is_none();
                if (segment.is_empty() && !last) || segment == "." || segment == ".." {
                    return false;
                }
            }
            true
        }
        let alphabet = [b'a', b'.', b'/', b'%', b'\\'];
        let mut paths = vec![String::from("/")];
        let mut all = paths.clone();
        for _ in 0..6 {
            paths = paths
                .iter()
                .flat_map(|p| alphabet.iter().map(move |&b| format!("{p}{}", b as char)))
                .collect();
            all.extend(paths.iter().cloned());
        }
        for path in &all {
            assert_eq!(is_normal(path), by_segments(path), "{path:?}");
            if is_normal(path) {
                assert_eq!(
                    rebuild(path).ok().as_deref(),
                    Some(path.as_str()),
                    "{path:?}"
                );
            }
        }
    }

    fn n(p: &str) -> String {
        normalise(p).unwrap().into_owned()
    }

    #[test]
    fn a_path_read_as_normal_is_its_own_rebuilt_normal_form() {
        let parts = [
            "", ".", "..", "a", "B", "%41", "%2f", "%7e", "x%20y", "\\", "é", "a.b", "...",
        ];
        let mut normal = 0;
        for a in parts {
            for b in parts {
                for c in parts {
                    for path in [
                        format!("/{a}/{b}/{c}"),
                        format!("/{a}/{b}"),
                        format!("/{a}"),
                    ] {
                        if is_normal(&path) {
                            normal += 1;
                            assert_eq!(rebuild(&path).as_deref(), Ok(path.as_str()), "{path}");
                        }
                        let full = rebuild(&path).map(Cow::into_owned);
                        assert_eq!(normalise(&path).map(Cow::into_owned), full, "{path}");
                    }
                }
            }
        }
        // The fast path is taken for some and not all of them.
        assert!(normal > 100 && normal < 2000, "{normal}");
    }

    #[test]
    fn the_issue_s_variants_all_become_the_same_path() {
        for p in [
            "/v1/payments/x",
            "//v1/payments/x",
            "/v1//payments///x",
            "/v1/%70ayments/x",
            "/%76%31/payments/x",
            "/v1/./payments/x",
            "/x/../v1/payments/x",
            "/v1/payments/y/../x",
            "/v1/payments/%2e/x",
            "/v1/%2E%2E/v1/payments/x",
        ] {
            assert_eq!(n(p), "/v1/payments/x", "{p}");
        }
        assert_eq!(n("/v1/payments/../x"), "/v1/x");
    }

    #[test]
    fn normal_paths_are_borrowed_unchanged() {
        for p in [
            "/",
            "/a",
            "/a/",
            "/a/b%20c",
            "/a/%C3%A9",
            "/a:b@c!$&'()*+,;=",
        ] {
            assert!(matches!(normalise(p), Ok(Cow::Borrowed(_))), "{p}");
        }
        assert_eq!(n("*"), "*");
    }

    #[test]
    fn other_escapes_stay_escaped_in_uppercase() {
        assert_eq!(n("/a/b%20c"), "/a/b%20c");
        assert_eq!(n("/a/%c3%a9"), "/a/%C3%A9");
        assert_eq!(n("/a/%3f"), "/a/%3F");
        assert_eq!(n("/%7euser"), "/~user");
    }

    #[test]
    fn trailing_slashes_and_dots() {
        assert_eq!(n("/a/"), "/a/");
        assert_eq!(n("/a//"), "/a/");
        assert_eq!(n("/a/."), "/a/");
        assert_eq!(n("/a/b/.."), "/a/");
        assert_eq!(n("/a/.."), "/");
        assert_eq!(n("//"), "/");
        assert_eq!(n("/./"), "/");
        // Only whole segments are dot segments.
        assert_eq!(n("/a/.b/..c/..."), "/a/.b/..c/...");
    }

    #[test]
    fn unsafe_paths_are_refused() {
        assert_eq!(
            normalise("/v1/a%2Fb"),
            Err(PathError::AmbiguousEscape("%2F"))
        );
        assert_eq!(
            normalise("/v1/a%2fb"),
            Err(PathError::AmbiguousEscape("%2F"))
        );
        assert_eq!(
            normalise("/v1/a%5cb"),
            Err(PathError::AmbiguousEscape("%5C"))
        );
        assert_eq!(
            normalise("/v1/a%00"),
            Err(PathError::AmbiguousEscape("%00"))
        );
        assert_eq!(normalise("/.."), Err(PathError::AboveRoot));
        assert_eq!(normalise("/a/../.."), Err(PathError::AboveRoot));
        assert_eq!(normalise("/%2e%2e/a"), Err(PathError::AboveRoot));
        for bad in ["/a%", "/a%2", "/a%zz", "/a%2g"] {
            assert_eq!(normalise(bad), Err(PathError::MalformedEscape), "{bad}");
        }
    }

    #[test]
    fn raw_utf8_is_kept_as_sent_and_matched_encoded() {
        assert_eq!(n("/files/na\u{ef}ve.txt"), "/files/na\u{ef}ve.txt");
        assert!(matches!(
            normalise("/files/na\u{ef}ve.txt"),
            Ok(Cow::Borrowed(_))
        ));
        assert_eq!(n("/a/./caf\u{e9}/"), "/a/caf\u{e9}/");
        assert_eq!(n("/\u{1F600}/%7e"), "/\u{1F600}/~");
        assert_eq!(match_form(&n("/v1/caf\u{e9}/x")), "/v1/caf%C3%A9/x");
        assert_eq!(match_form(&n("/v1/caf%c3%a9/x")), "/v1/caf%C3%A9/x");
        assert!(matches!(match_form("/v1/x"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_raw_backslash_is_refused() {
        for p in ["/v1\\payments", "/v1/payments\\..\\x", "/\\"] {
            assert_eq!(normalise(p), Err(PathError::Backslash), "{p}");
        }
    }

    #[test]
    fn normalising_is_idempotent() {
        for p in [
            "//a/./b/../c/",
            "/%41%2e%7E/x",
            "/a/%c3%a9/..",
            "/a/b/c/../../d",
        ] {
            let once = n(p);
            assert_eq!(n(&once), once, "{p}");
        }
    }
}
