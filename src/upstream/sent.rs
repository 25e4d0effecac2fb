//! A client's HTTP/1.1 request head as it was sent, and the head the upstream gets for it,
//! written straight from those bytes by the rules [`crate::upstream::Upstream::prepare`]
//! applies to a header map: what the HTTP/1 lane ([`crate::lane`]) sends, without a map.
//! Pure.

use std::ops::Range;

use bytes::Bytes;
use http::Method;

use super::LaneTarget;

/// What the upstream is told about the hop.
pub struct Hop<'a> {
    /// The upstream's `Host`.
    pub host: &'a [u8],
    /// The path every target goes under.
    pub base_path: &'a [u8],
    /// The client's address, for `X-Forwarded-For`.
    pub client_ip: &'a [u8],
    /// The client's hop is TLS: `X-Forwarded-Proto` is `https`, whatever the client said.
    pub tls: bool,
}

/// The request line and fields the upstream gets for a request with `method`, `target`
/// (origin form, in normal form) and `fields` (names in any case, as sent), with `room`
/// bytes to spare, and without the blank line that ends a head: origin form under the base
/// path, names in lower case, `Host` the upstream's, the client's `Host` as
/// `X-Forwarded-Host` and `http` as `X-Forwarded-Proto` unless the client set them (`https`
/// over TLS, whatever the client set), `X-Forwarded-For` every prior hop then the client,
/// no `Connection`, and never a client's `Idempotency-Fence` or `Idempotency-Scope`.
pub fn write_head<'f>(
    method: &Method,
    target: &[u8],
    fields: impl Iterator<Item = (&'f [u8], &'f [u8])>,
    hop: &Hop<'_>,
    room: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(room);
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(hop.base_path);
    out.extend_from_slice(target);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let (mut proto, mut forwarded_host) = (false, false);
    let mut host: &[u8] = b"";
    let mut prior: Vec<&[u8]> = Vec::new();
    for (name, value) in fields {
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        match name.len() {
            4 if is(b"host") => {
                host = value;
                continue;
            }
            10 if is(b"connection") => continue,
            15 if is(b"x-forwarded-for") => {
                if value.iter().all(|&b| b == b'\t' || (32..127).contains(&b)) {
                    prior.push(value);
                }
                continue;
            }
            17 if is(b"idempotency-fence") || is(b"idempotency-scope") => continue,
            17 if is(b"x-forwarded-proto") && hop.tls => continue,
            17 if is(b"x-forwarded-proto") => proto = true,
            16 if is(b"x-forwarded-host") => forwarded_host = true,
            _ => {}
        }
        field(&mut out, name, value);
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    for hop in prior {
        out.extend_from_slice(hop);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(hop.client_ip);
    out.extend_from_slice(b"\r\n");
    if hop.tls {
        out.extend_from_slice(b"x-forwarded-proto: https\r\n");
    } else if !proto {
        out.extend_from_slice(b"x-forwarded-proto: http\r\n");
    }
    if !forwarded_host {
        field(&mut out, b"x-forwarded-host", host);
    }
    field(&mut out, b"host", hop.host);
    out
}

/// `name: value`, the name in lower case: a field line as the lane writes heads.
pub fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    let at = out.len();
    out.extend_from_slice(name);
    out[at..].make_ascii_lowercase();
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Where a head's target and fields are in the buffer it was read from (whose start is the
/// head's), before that buffer is taken whole ([`SentLayout::sent`]).
pub struct SentLayout {
    /// The request's method.
    pub method: Method,
    /// The target, as sent.
    pub target: Range<usize>,
    /// Each field's name and value, as sent and in order.
    pub fields: Vec<(Range<usize>, Range<usize>)>,
    /// The client's hop is TLS.
    pub tls: bool,
}

impl SentLayout {
    /// The head in `bytes`, the buffer this layout was read from (or its head alone).
    pub fn sent(self, bytes: Bytes) -> SentHead {
        SentHead {
            bytes,
            layout: self,
        }
    }
}

/// A request head as the client sent it, kept for the head a keyed request's winner sends
/// upstream: written only once the claim is won, so a replay, a 409 or a 422 writes none.
pub struct SentHead {
    bytes: Bytes,
    layout: SentLayout,
}

impl SentHead {
    /// The head the winner sends to `to` for a client at `client_ip`, as
    /// [`write_head`] writes it, but for the owner's fields, which the winner adds: without
    /// a client's `Idempotency-Key` (the owner's replaces it) and without the blank line.
    pub fn keyed_upstream(&self, to: LaneTarget<'_>, client_ip: &[u8]) -> Vec<u8> {
        let SentLayout {
            method,
            target,
            fields,
            tls,
        } = &self.layout;
        let b = &self.bytes[..];
        let hop = Hop {
            host: to.host,
            base_path: to.base_path,
            client_ip,
            tls: *tls,
        };
        let fields = fields
            .iter()
            .map(|(n, v)| (&b[n.clone()], &b[v.clone()]))
            .filter(|(n, _)| !n.eq_ignore_ascii_case(b"idempotency-key"));
        // Room for the owner's three fields and the blank line.
        let room = b.len() + to.base_path.len() + 160 + 256;
        write_head(method, &b[target.clone()], fields, &hop, room)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lane::head::{read, Read};

    #[test]
    fn a_winners_head_is_the_lanes_but_for_the_clients_key_and_the_blank_line() {
        let raw = "POST /v1/orders?x=1 HTTP/1.1\r\nHost: gw.example\r\nIdempotency-Key: k-1\r\n\
                   X-Forwarded-For: 1.1.1.1\r\nIdempotency-Fence: 9\r\nX-Dup: 1\r\nX-Dup: 2\r\n\
                   Content-Length: 2\r\n\r\n{}";
        let Read::Lane(head) = read(raw.as_bytes(), 8192) else {
            panic!("the lane takes it");
        };
        for tls in [false, true] {
            let to = LaneTarget {
                host: b"up:9000",
                base_path: b"/base",
            };
            let hop = Hop {
                host: to.host,
                base_path: to.base_path,
                client_ip: b"10.0.0.1",
                tls,
            };
            let lane = String::from_utf8(head.upstream(&hop)).unwrap();
            let sent = head.layout(raw.as_bytes(), tls).sent(Bytes::from(raw));
            let keyed = String::from_utf8(sent.keyed_upstream(to, b"10.0.0.1")).unwrap();
            assert_eq!(
                format!("{keyed}\r\n"),
                lane.replace("idempotency-key: k-1\r\n", "")
            );
            assert!(
                keyed.starts_with("POST /base/v1/orders?x=1 HTTP/1.1\r\n"),
                "{keyed}"
            );
            assert!(keyed.contains("\r\nx-dup: 1\r\nx-dup: 2\r\n"), "{keyed}");
            assert!(
                keyed.contains("\r\nx-forwarded-for: 1.1.1.1, 10.0.0.1\r\n"),
                "{keyed}"
            );
            assert!(!keyed.contains("idempotency-fence") && !keyed.ends_with("\r\n\r\n"));
        }
    }
}
