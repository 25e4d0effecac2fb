//! What a proxy does to a message's framing and hop-by-hop fields between its two sides,
//! in one place, whichever HTTP stack read or writes the message (pure).
//!
//! - The hop-by-hop fields (RFC 9110 §7.6.1), and those `Connection` names, never cross.
//! - A response's `Content-Length` crosses only where it framed the body the upstream
//!   sent: beside a `Transfer-Encoding` it is dropped (RFC 9112 §6.1: the coding wins, and
//!   a proxy removes the length); a list of one number is that number (RFC 9110 §8.6);
//!   two numbers are no answer at all.
//! - A record keeps none of them ([`is_framing`]): a stored response is data, and each
//!   writer frames it from the body it sends ([`frame_for_client`]). A stale length
//!   written beside a longer body puts the rest of that body where the client reads its
//!   next answer: a response smuggled to whoever sent the next request.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// How many names [`HOP_BY_HOP`] has.
pub(crate) const HOPS: usize = 7;

/// Headers that belong to one hop (RFC 9110 §7.6.1) and never cross the proxy. `Trailer`
/// does: it names the trailer fields the message ends with, which are forwarded, stored
/// and replayed.
pub(crate) static HOP_BY_HOP: [HeaderName; HOPS] = [
    header::CONNECTION,
    crate::protocol::headers::KEEP_ALIVE,
    crate::protocol::headers::PROXY_CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
];

/// Where a field name (in any case) is among the hop-by-hop names: its index in
/// [`HOP_BY_HOP`], or [`HOPS`] for `Upgrade`. By length first: most names are no
/// candidate's length, and the rest are compared with one name.
#[inline]
pub(crate) fn hop_by_hop(name: &[u8]) -> Option<usize> {
    let (i, known): (usize, &[u8]) = match name.len() {
        2 => (5, b"te"),
        7 => (HOPS, b"upgrade"),
        10 if name[0].eq_ignore_ascii_case(&b'c') => (0, b"connection"),
        10 => (1, b"keep-alive"),
        16 => (2, b"proxy-connection"),
        17 => (6, b"transfer-encoding"),
        18 => (3, b"proxy-authenticate"),
        19 => (4, b"proxy-authorization"),
        _ => return None,
    };
    name.eq_ignore_ascii_case(known).then_some(i)
}

/// Removes hop-by-hop headers, including every header named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Which of them are there, in one pass over the names: a message carries a few
    // headers and seldom more than `Connection` of these, and each `remove` hashes its
    // name whether or not the map has it (5.5% of a streamed request's instructions).
    let mut present = [false; HOPS + 1];
    for name in headers.keys() {
        if let Some(i) = hop_by_hop(name.as_str().as_bytes()) {
            present[i] = true;
        }
    }
    // `HOP_BY_HOP[0]` is `Connection`: the names it lists go too.
    if present[0] {
        let listed: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            // `keep-alive`, what nearly every `Connection` says, is one of these already:
            // it needs no parsing and no list.
            .filter(|n| !n.eq_ignore_ascii_case("keep-alive"))
            .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
            .collect();
        for name in listed {
            headers.remove(name);
        }
    }
    for (name, _) in HOP_BY_HOP.iter().zip(present).filter(|(_, there)| *there) {
        headers.remove(name);
    }
    if present[HOPS] {
        headers.remove(header::UPGRADE);
    }
}

/// Whether a field is about how one hop frames or carries a message: hop-by-hop, or
/// `Content-Length`. Such a field is never stored in a record nor replayed from one.
pub fn is_framing(name: &[u8]) -> bool {
    hop_by_hop(name).is_some() || name.eq_ignore_ascii_case(b"content-length")
}

/// A response's `Content-Length` that cannot be: two different numbers, or no number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the response's Content-Length is not one number")]
pub struct InvalidLength;

/// The `Content-Length` a response keeps once it crosses the proxy: none beside a
/// `Transfer-Encoding` (RFC 9112 §6.1), else the one number its values say (a list of
/// the same number is that number, RFC 9110 §8.6), else none.
pub fn kept_length<'v>(
    transfer_coded: bool,
    values: impl IntoIterator<Item = &'v [u8]>,
) -> Result<Option<u64>, InvalidLength> {
    if transfer_coded {
        return Ok(None);
    }
    let mut found = None;
    for part in values.into_iter().flat_map(|v| v.split(|b| *b == b',')) {
        let part = part.trim_ascii();
        if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
            return Err(InvalidLength);
        }
        let n = part.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        match found {
            Some(seen) if seen != n => return Err(InvalidLength),
            _ => found = Some(n),
        }
    }
    Ok(found)
}

/// An upstream response's head made fit to cross (see the module's rules): its
/// `Content-Length` kept only where it framed the body, as one number, and its hop-by-hop
/// fields stripped.
pub fn response_head(headers: &mut HeaderMap) -> Result<(), InvalidLength> {
    let coded = headers.contains_key(header::TRANSFER_ENCODING);
    response_length(headers, coded)?;
    strip_hop_by_hop(headers);
    Ok(())
}

/// A response's `Content-Length` as [`kept_length`] keeps it, in `headers`; `coded`: the
/// response had a `Transfer-Encoding` (which a reader may have taken out already).
pub fn response_length(headers: &mut HeaderMap, coded: bool) -> Result<(), InvalidLength> {
    let lengths = headers.get_all(header::CONTENT_LENGTH);
    let listed =
        lengths.iter().nth(1).is_some() || lengths.iter().any(|v| v.as_bytes().contains(&b','));
    if coded || listed {
        let kept = kept_length(coded, lengths.iter().map(HeaderValue::as_bytes))?;
        headers.remove(header::CONTENT_LENGTH);
        if let Some(n) = kept {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
    Ok(())
}

/// A request's head made fit to go upstream: hop-by-hop fields stripped; `Expect` too
/// (the gateway's server answers the client's `100-continue` itself as it reads the
/// body: the upstream would be asked a question that has been answered); a field whose
/// name holds `_` dropped unless `underscores` (some upstream frameworks read `_` and `-`
/// as one, CGI-style, so `Transfer_Encoding` would frame what this proxy did not; nginx
/// drops them too); a `Content-Length` written as its number (`0005` is `5`).
pub fn request_head(headers: &mut HeaderMap, underscores: bool) {
    strip_hop_by_hop(headers);
    headers.remove(header::EXPECT);
    if !underscores && headers.keys().any(|n| n.as_str().contains('_')) {
        let named: Vec<HeaderName> = headers
            .keys()
            .filter(|n| n.as_str().contains('_'))
            .cloned()
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    let padded = headers
        .get(header::CONTENT_LENGTH)
        .map(HeaderValue::as_bytes)
        .filter(|v| v.len() > 1 && v[0] == b'0');
    if let Some(Ok(Some(n))) = padded.map(|v| kept_length(false, [v])) {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
}

/// A response's head as the writer that sends it to the client frames it: it derives the
/// length from the body it sends (`exact`, when the body knows it), so no
/// `Content-Length` from anywhere else is written beside that body, and no
/// `Transfer-Encoding`. A bodiless answer (to `HEAD`, a 204 or a 304) keeps its
/// `Content-Length`, which describes a body not sent; so does a streamed body that was
/// framed by it (the upstream's, read to that length).
pub fn frame_for_client(headers: &mut HeaderMap, exact: Option<u64>, bodiless: bool) {
    headers.remove(header::TRANSFER_ENCODING);
    if exact.is_some() && !bodiless {
        headers.remove(header::CONTENT_LENGTH);
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn strips_hop_by_hop_and_connection_listed_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, X-Secret"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("content-type"));
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("Close , Keep-Alive,x-other"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-other", HeaderValue::from_static("1"));
        h.insert("close", HeaderValue::from_static("named, so it goes"));
        h.insert("x-stays", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-stays"));
        // Each one alone, among others that stay.
        for name in HOP_BY_HOP.iter().chain([&header::UPGRADE]) {
            let mut h = HeaderMap::new();
            h.insert("content-type", HeaderValue::from_static("text/plain"));
            h.append(name.clone(), HeaderValue::from_static("x"));
            h.append(name.clone(), HeaderValue::from_static("y"));
            h.insert("x-request-id", HeaderValue::from_static("1"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h.len(), 2, "{name}: {h:?}");
            assert!(!h.contains_key(name), "{name}");
        }
    }

    #[test]
    fn a_length_crosses_only_where_it_framed_the_body() {
        let map = |fields: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (n, v) in fields {
                let name = HeaderName::from_bytes(n.as_bytes()).unwrap();
                h.append(name, HeaderValue::from_str(v).unwrap());
            }
            h
        };
        // Beside a transfer coding: dropped, whatever it says.
        let mut h = map(&[("content-length", "4"), ("transfer-encoding", "chunked")]);
        response_head(&mut h).unwrap();
        assert!(h.is_empty(), "{h:?}");
        let mut h = map(&[
            ("transfer-encoding", "gzip, chunked"),
            ("content-length", "x"),
        ]);
        response_head(&mut h).unwrap();
        assert!(h.is_empty(), "{h:?}");
        // One number, however often it is said.
        for lengths in [&["4, 4"][..], &["4", "4"], &["4,4", " 4 "]] {
            let mut h = map(&lengths
                .iter()
                .map(|v| ("content-length", *v))
                .collect::<Vec<_>>());
            response_head(&mut h).unwrap();
            assert_eq!(h.get_all("content-length").iter().count(), 1, "{lengths:?}");
            assert_eq!(h["content-length"], "4", "{lengths:?}");
        }
        // Two numbers, or none: no answer.
        for lengths in [
            &["4, 5"][..],
            &["4", "5"],
            &["4,"],
            &["+4", "+4"],
            &["0x4, 0x4"],
        ] {
            let mut h = map(&lengths
                .iter()
                .map(|v| ("content-length", *v))
                .collect::<Vec<_>>());
            assert_eq!(response_head(&mut h), Err(InvalidLength), "{lengths:?}");
        }
        assert_eq!(kept_length(false, [&b"0005"[..]]), Ok(Some(5)));
        assert_eq!(kept_length(false, []), Ok(None));
        assert_eq!(kept_length(true, [&b"4, 5"[..]]), Ok(None));
    }

    #[test]
    fn a_request_goes_upstream_without_what_only_this_hop_may_read() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("content-length", "0005"),
            ("expect", "100-continue"),
            ("transfer_encoding", "chunked"),
            ("x_forwarded_for", "1.2.3.4"),
            ("x-kept", "1"),
            ("connection", "keep-alive"),
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        let mut kept = h.clone();
        request_head(&mut h, false);
        let names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["content-length", "x-kept"], "{h:?}");
        assert_eq!(h["content-length"], "5");
        request_head(&mut kept, true);
        assert!(
            kept.contains_key("transfer_encoding"),
            "kept when asked: {kept:?}"
        );
        assert!(!kept.contains_key("expect"), "{kept:?}");
    }

    #[test]
    fn a_record_keeps_no_framing_field() {
        for name in [
            "Content-Length",
            "transfer-encoding",
            "connection",
            "keep-alive",
            "te",
            "upgrade",
        ] {
            assert!(is_framing(name.as_bytes()), "{name}");
        }
        for name in [
            "content-type",
            "trailer",
            "content-encoding",
            "date",
            "content-lengths",
        ] {
            assert!(!is_framing(name.as_bytes()), "{name}");
        }
    }

    #[test]
    fn the_client_s_writer_frames_a_known_body_from_the_body() {
        let framed = || {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("4"));
            h.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
            h
        };
        let mut h = framed();
        frame_for_client(&mut h, Some(48), false);
        assert!(h.is_empty(), "{h:?}");
        let mut h = framed();
        frame_for_client(&mut h, Some(0), true);
        assert_eq!(
            h["content-length"], "4",
            "an answer to HEAD declares its length"
        );
        let mut h = framed();
        frame_for_client(&mut h, None, false);
        assert_eq!(
            h["content-length"], "4",
            "a streamed body framed by its length"
        );
        assert!(!h.contains_key(header::TRANSFER_ENCODING));
    }
}
