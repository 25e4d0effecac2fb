//! The hop-by-hop fields (RFC 9110 §7.6.1): which they are, found by name, and stripped
//! from a message's header map.

use http::header::{self, HeaderMap, HeaderName};

/// How many names [`HOP_BY_HOP`] has.
pub(crate) const HOPS: usize = 7;

/// Headers that belong to one hop (RFC 9110 §7.6.1) and never cross the proxy. `Trailer`
/// does: it names the trailer fields the message ends with, which are forwarded, stored
/// and replayed.
pub(crate) static HOP_BY_HOP: [HeaderName; HOPS] = [
    header::CONNECTION,
    crate::headers::KEEP_ALIVE,
    crate::headers::PROXY_CONNECTION,
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
}
