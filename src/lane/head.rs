//! A client's request head, read once: whether the lane may take it, and the head the
//! upstream gets for it, written straight from the client's bytes.
//!
//! The lane takes only what it forwards exactly as the full path would: HTTP/1.1, a
//! common method in upper case, an origin-form target already in normal form, one plain
//! `Host`, at most one `Content-Length` and a small body, and no field that changes how
//! the message is framed or upgraded (`Transfer-Encoding`, `Upgrade`, `Expect`, `TE`,
//! `Connection` beyond `close` or `keep-alive`, the other hop-by-hop fields). Anything
//! else is [`Read::Other`]: the full path serves it, and the connection from then on.

use std::mem::MaybeUninit;

use http::Method;

use crate::upstream::sent::{write_head, SentLayout};

/// The most header fields a request head may have in the lane (hyper's default).
const MAX_FIELDS: usize = 100;
/// The longest target the lane takes: what the `http` crate's URIs hold (hyper answers a
/// longer one 414).
const MAX_TARGET: usize = 65_535;
/// The largest body the lane buffers; a larger one takes the full path, which streams it.
pub const MAX_BODY: usize = 64 * 1024;

/// What the start of the connection's buffer holds.
#[derive(Debug)]
pub enum Read<'b> {
    /// Not a whole head yet.
    Partial,
    /// A request the lane takes.
    Lane(Head<'b>),
    /// Anything else: for the full path.
    Other,
}

/// A request head the lane takes.
#[derive(Debug)]
pub struct Head<'b> {
    /// Its method.
    pub method: Method,
    /// The target as sent: path and query.
    pub target: &'b str,
    /// The target's path.
    pub path: &'b str,
    /// The head's length in bytes, its blank line included.
    pub len: usize,
    /// The body's length (`Content-Length`, or none).
    pub body: usize,
    /// The client asked for the connection to close after this request.
    pub close: bool,
    /// Its fields, as sent.
    fields: Vec<(&'b str, &'b [u8])>,
}

/// Reads the request head at the start of `buf`; a head that reaches `max_head` bytes
/// unfinished is for the full path (which answers it as it answers any head too large).
pub fn read(buf: &[u8], max_head: usize) -> Read<'_> {
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut req,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(len)) if len <= max_head => len,
        Ok(httparse::Status::Partial) if buf.len() < max_head => return Read::Partial,
        _ => return Read::Other,
    };
    if req.version != Some(1) {
        return Read::Other;
    }
    let (Some(method), Some(target)) = (req.method.and_then(method), req.path) else {
        return Read::Other;
    };
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    if !plain_target(target)
        || !matches!(
            crate::path::normalise(path),
            Ok(std::borrow::Cow::Borrowed(_))
        )
    {
        return Read::Other;
    }
    let mut head = Head {
        method,
        target,
        path,
        len,
        body: 0,
        close: false,
        fields: Vec::with_capacity(req.headers.len()),
    };
    let (mut hosts, mut lengths) = (0, 0);
    for field in req.headers.iter() {
        let name = field.name;
        let value = field.value;
        match Field::of(name.as_bytes()) {
            Field::Host => {
                hosts += 1;
                if !(value.is_empty() || crate::http::is_plain_host(value)) {
                    return Read::Other;
                }
            }
            Field::Length => {
                lengths += 1;
                match length(value) {
                    Some(n) if n <= MAX_BODY => head.body = n,
                    _ => return Read::Other,
                }
            }
            Field::Connection => match value.trim_ascii() {
                v if v.eq_ignore_ascii_case(b"close") => head.close = true,
                v if v.eq_ignore_ascii_case(b"keep-alive") => {}
                _ => return Read::Other,
            },
            Field::Refused => return Read::Other,
            Field::Other => {}
        }
        head.fields.push((name, value));
    }
    if hosts != 1 || lengths > 1 {
        return Read::Other;
    }
    Read::Lane(head)
}

/// The methods the lane takes: the common ones, spelled as a route names them.
fn method(m: &str) -> Option<Method> {
    Some(match m {
        "GET" => Method::GET,
        "POST" => Method::POST,
        "PUT" => Method::PUT,
        "PATCH" => Method::PATCH,
        "DELETE" => Method::DELETE,
        "HEAD" => Method::HEAD,
        "OPTIONS" => Method::OPTIONS,
        _ => return None,
    })
}

/// An origin-form target of unreserved and sub-delimiter characters, escapes, `:`, `@`,
/// `/` and `?`: what every parser reads the same way.
fn plain_target(target: &str) -> bool {
    target.starts_with('/')
        && target.len() < MAX_TARGET
        && target.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'-' | b'.'
                        | b'_'
                        | b'~'
                        | b'!'
                        | b'$'
                        | b'&'
                        | b'\''
                        | b'('
                        | b')'
                        | b'*'
                        | b'+'
                        | b','
                        | b';'
                        | b'='
                        | b':'
                        | b'@'
                        | b'/'
                        | b'%'
                        | b'?'
                )
        })
}

/// A `Content-Length` of digits only, with no leading zero (`0005` goes to the full path,
/// which writes it upstream as its number).
fn length(value: &[u8]) -> Option<usize> {
    let value = value.trim_ascii();
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if value.len() > 1 && value[0] == b'0' {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// What a request field is to the lane.
enum Field {
    Host,
    Length,
    Connection,
    /// A field only the full path handles.
    Refused,
    Other,
}

impl Field {
    fn of(name: &[u8]) -> Self {
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        match name.len() {
            4 if is(b"host") => Self::Host,
            14 if is(b"content-length") => Self::Length,
            10 if is(b"connection") => Self::Connection,
            2 if is(b"te") => Self::Refused,
            6 if is(b"expect") => Self::Refused,
            7 if is(b"upgrade") || is(b"trailer") => Self::Refused,
            _ if crate::hops::hop_by_hop(name).is_some() => Self::Refused,
            // Dropped or kept by `server.underscores_in_headers`: the full path decides.
            _ if name.contains(&b'_') => Self::Refused,
            _ => Self::Other,
        }
    }
}

pub use crate::upstream::sent::Hop;

impl Head<'_> {
    /// The head the upstream gets, as the full path writes it (see
    /// [`crate::upstream::sent::write_head`]). Room is left for the body.
    pub fn upstream(&self, hop: &Hop<'_>) -> Vec<u8> {
        let fields = self.fields.iter().map(|&(n, v)| (n.as_bytes(), v));
        let room = self.len + 160 + self.body;
        let mut out = write_head(&self.method, self.target.as_bytes(), fields, hop, room);
        out.extend_from_slice(b"\r\n");
        out
    }

    /// Where this head's target and fields are in `buf` (the buffer it was read from, whose
    /// start is the head's), for the head a winner sends upstream once the claim is won
    /// ([`crate::upstream::sent::SentHead::keyed_upstream`]): nothing is written for a request that never calls.
    pub fn layout(&self, buf: &[u8], tls: bool) -> SentLayout {
        let at = |part: &[u8]| {
            let start = part.as_ptr() as usize - buf.as_ptr() as usize;
            start..start + part.len()
        };
        SentLayout {
            method: self.method.clone(),
            target: at(self.target.as_bytes()),
            fields: self
                .fields
                .iter()
                .map(|&(n, v)| (at(n.as_bytes()), at(v)))
                .collect(),
            tls,
        }
    }
}

impl Head<'_> {
    /// The request as the full pipeline takes it, its body to follow (`None` when a field
    /// is one the `http` crate will not hold: the full path answers it). Over TLS its
    /// `X-Forwarded-Proto` is `https`, whatever the client said, as hyper's requests get.
    pub fn request(&self, tls: bool) -> Option<http::request::Parts> {
        let uri = http::uri::PathAndQuery::try_from(self.target).ok()?;
        let (mut parts, ()) = http::Request::new(()).into_parts();
        parts.method = self.method.clone();
        parts.uri = http::Uri::from(uri);
        parts.version = http::Version::HTTP_11;
        parts.headers.reserve(self.fields.len() + 1);
        for &(name, value) in &self.fields {
            let name = http::HeaderName::from_bytes(name.as_bytes()).ok()?;
            let value = http::HeaderValue::from_bytes(value).ok()?;
            parts.headers.append(name, value);
        }
        if tls {
            parts.headers.insert(
                crate::headers::X_FORWARDED_PROTO.clone(),
                http::HeaderValue::from_static("https"),
            );
        }
        Some(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOP: Hop<'static> = Hop {
        host: b"up:9000",
        base_path: b"",
        client_ip: b"10.0.0.1",
        tls: false,
    };

    fn lane(raw: &str) -> Head<'_> {
        match read(raw.as_bytes(), 8192) {
            Read::Lane(head) => head,
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    fn other(raw: &str) -> bool {
        matches!(read(raw.as_bytes(), 8192), Read::Other)
    }

    #[test]
    fn a_plain_request_is_rewritten_for_the_upstream_as_the_full_path_does() {
        let raw = "POST /v1/orders?x=1 HTTP/1.1\r\nHost: gw.example:8080\r\nContent-Type: a/b\r\n\
                   X-Forwarded-For: 1.1.1.1\r\nIdempotency-Fence: 99\r\nConnection: keep-alive\r\n\
                   Content-Length: 2\r\n\r\nok";
        let head = lane(raw);
        assert_eq!((head.len, head.body, head.close), (raw.len() - 2, 2, false));
        assert_eq!(head.path, "/v1/orders");
        let up = Hop {
            base_path: b"/api",
            ..HOP
        };
        assert_eq!(
            String::from_utf8(head.upstream(&up)).unwrap(),
            "POST /api/v1/orders?x=1 HTTP/1.1\r\ncontent-type: a/b\r\ncontent-length: 2\r\n\
             x-forwarded-for: 1.1.1.1, 10.0.0.1\r\nx-forwarded-proto: http\r\n\
             x-forwarded-host: gw.example:8080\r\nhost: up:9000\r\n\r\n"
        );
        let kept = lane(
            "GET / HTTP/1.1\r\nhost: a\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: b\r\n\
             Connection: close\r\n\r\n",
        );
        assert!(kept.close);
        assert_eq!(
            String::from_utf8(kept.upstream(&HOP)).unwrap(),
            "GET / HTTP/1.1\r\nx-forwarded-proto: https\r\nx-forwarded-host: b\r\n\
             x-forwarded-for: 10.0.0.1\r\nhost: up:9000\r\n\r\n"
        );
        // Over TLS the hop says so, whatever the client claimed.
        let plain = lane("GET / HTTP/1.1\r\nhost: a\r\nX-Forwarded-Proto: http\r\n\r\n");
        let tls = Hop { tls: true, ..HOP };
        assert_eq!(
            String::from_utf8(plain.upstream(&tls)).unwrap(),
            "GET / HTTP/1.1\r\nx-forwarded-for: 10.0.0.1\r\nx-forwarded-proto: https\r\n\
             x-forwarded-host: a\r\nhost: up:9000\r\n\r\n"
        );
    }

    #[test]
    fn what_the_full_path_must_judge_is_left_to_it() {
        for raw in [
            "GET / HTTP/1.0\r\nHost: a\r\n\r\n",
            "get / HTTP/1.1\r\nHost: a\r\n\r\n",
            "CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /a/../b HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /caf%C3%A9/%2e%2e HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /a\"b HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: u@a\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: close, x-a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nKeep-Alive: timeout=5\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nProxy-Authorization: x\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nX: \x01\r\n\r\n",
        ] {
            assert!(other(raw), "{raw:?}");
        }
        assert!(matches!(
            read(b"GET / HTTP/1.1\r\nHost: a\r\n", 8192),
            Read::Partial
        ));
        assert!(matches!(
            read(b"GET / HTTP/1.1\r\nHost: a\r\n", 20),
            Read::Other
        ));
        assert!(matches!(
            read(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 20),
            Read::Other
        ));
    }
}
