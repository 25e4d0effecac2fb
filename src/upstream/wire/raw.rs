//! An exchange in bytes, for the HTTP/1 lane ([`crate::lane`]): a request already encoded
//! is written as it is, and the response head is turned straight into the head the client
//! gets (hop-by-hop fields cut), with no header map on either side.

use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode, Version};

use super::head::{parse_head, response_framing, Framing, FramingFields, Parsed, Start};
use super::upload::Upload;
use super::{Answer, Conn, WireBody, WireError};

/// A response head already written out for the client.
#[derive(Debug)]
pub struct RawHead {
    /// The status.
    pub status: StatusCode,
    /// How the body is delimited on the upstream connection.
    pub framing: Framing,
    /// The connection may carry another request once this response is read.
    keep_alive: bool,
    /// The upstream sent a `Date`.
    pub dated: bool,
    /// The upstream answered in HTTP/1.0.
    pub http10: bool,
    /// The `Content-Length` the upstream declared, when it is one number: what a `HEAD`
    /// answer says of the body it would have.
    pub declared: Option<u64>,
}

/// A response's fields already written for the client (`name: value` lines, as the relay
/// writes an upstream answer's: hop-by-hop fields and `Content-Length` cut), which
/// the lane's writer (`lane::answer::served`) puts after the status line and before the header map's own. A keyed
/// request's winner in the lane answers with one (its upstream answer never becomes a
/// header map); only responses to the lane's requests carry it, since hyper's writer does
/// not read it.
#[derive(Debug, Clone)]
pub struct Written {
    /// The lines.
    pub fields: Bytes,
    /// They hold a `Date`.
    pub dated: bool,
}

impl Written {
    /// The response that answers with these lines and `body`: its map holds only
    /// `length`, a `Content-Length` the body does not show (what an answer to `HEAD`
    /// declares), for the writer's framing.
    pub fn response(
        self,
        status: StatusCode,
        body: Bytes,
        length: Option<http::HeaderValue>,
    ) -> http::Response<crate::Body> {
        let mut response = http::Response::new(crate::full(body));
        *response.status_mut() = status;
        if let Some(n) = length {
            response
                .headers_mut()
                .insert(http::header::CONTENT_LENGTH, n);
        }
        response.extensions_mut().insert(self);
        response
    }
}

impl RawHead {
    /// The head as a header map would hold it, from what [`parse_response`] wrote
    /// (`written`, its status line first): for an answer that goes on as a header map after
    /// all (one the protocol does not store whole). The `Content-Length` the head had comes
    /// back, after the other fields.
    pub fn parts(&self, written: &[u8]) -> http::response::Parts {
        let (mut parts, ()) = http::Response::new(()).into_parts();
        parts.status = self.status;
        if self.http10 {
            parts.version = Version::HTTP_10;
        }
        let fields = written_fields(after_status_line(written));
        parts.headers.reserve(fields.clone().count() + 1);
        for (name, value) in fields {
            // Both were valid as they were read.
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(name),
                http::HeaderValue::from_bytes(value),
            ) {
                parts.headers.append(n, v);
            }
        }
        if let Some(n) = self.declared {
            parts.headers.insert(http::header::CONTENT_LENGTH, n.into());
        }
        parts
    }
}

/// What follows the status line of a head [`parse_response`] wrote: its fields.
pub fn after_status_line(written: &[u8]) -> &[u8] {
    match memchr::memchr(b'\n', written) {
        Some(end) => &written[end + 1..],
        None => &[],
    }
}

/// The fields of a head [`parse_response`] wrote (`name: value` lines, names in lower
/// case), after its status line: each one's name and value.
pub fn written_fields(fields: &[u8]) -> WrittenFields<'_> {
    WrittenFields { rest: fields }
}

/// Whether a head [`parse_response`] wrote has a field `name` (lower case, with no colon).
pub fn has_written_field(written: &[u8], name: &[u8]) -> bool {
    // Every field follows a line's end; a value holds no line end.
    // (A `memmem` search built its searcher each call: more than the rest of the answer's
    // record.)
    memchr::memchr_iter(b'\n', written).any(|end| {
        let line = &written[end + 1..];
        line.len() > name.len() && line.starts_with(name) && line[name.len()] == b':'
    })
}

/// The fields [`written_fields`] reads.
#[derive(Debug, Clone)]
pub struct WrittenFields<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for WrittenFields<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let end = memchr::memchr(b'\n', self.rest)?;
        let line = &self.rest[..end];
        self.rest = &self.rest[end + 1..];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        // A name holds no colon: the first one ends it, and one space follows.
        let colon = memchr::memchr(b':', line)?;
        let value = &line[colon + 1..];
        Some((&line[..colon], value.strip_prefix(b" ").unwrap_or(value)))
    }
}

impl Answer for RawHead {
    fn close(&mut self) {
        self.keep_alive = false;
    }
}

/// An exchange in bytes that got no response head.
#[derive(Debug)]
pub enum RawFailed {
    /// No byte of the request left: it can go on another connection.
    Unsent(WireError),
    /// The request may have reached the upstream.
    Broken(WireError),
}

impl RawFailed {
    /// An encoded exchange that failed with `e` before its head: unsent while no byte of
    /// `upload` (what is left of the request) has left.
    pub(super) fn of(e: WireError, upload: Option<&Upload>) -> Self {
        match upload {
            Some(u) if u.unsent() => Self::Unsent(e),
            _ => Self::Broken(e),
        }
    }
}

impl Conn {
    /// Writes `request` (a whole message: its head, then its body) and reads the answer's head,
    /// written for the client into `out` (status line and fields, without the blank line
    /// that ends a head). The body is read from the [`WireBody`], which hands the
    /// connection back at its end.
    pub async fn relay(
        mut self,
        request: [Bytes; 2],
        method: &Method,
        out: &mut Vec<u8>,
    ) -> Result<(RawHead, WireBody), RawFailed> {
        let mut upload = Some(Upload::bytes(request));
        let answered = self
            .answer(&mut upload, |read| parse_response(read, method, out))
            .await;
        match answered {
            Ok(head) => {
                let body = WireBody::new(self, head.framing, head.keep_alive, upload);
                Ok((head, body))
            }
            Err(e) => Err(RawFailed::of(e, upload.as_ref())),
        }
    }
}

/// Parses the response head at the start of `buf`, for a request made with `method`: once
/// it is whole, its status line and its end-to-end fields go to `out` as an HTTP/1.1
/// server sends them (names in lower case, the reason phrase the status's own), and the
/// head is taken out of `buf`. Hop-by-hop fields, and those `Connection` names, are cut
/// (RFC 9110 §7.6.1); so is `Content-Length`, which the client's framing is written from
/// (see [`crate::lane::answer`]).
pub(super) fn parse_response(
    buf: &mut BytesMut,
    method: &Method,
    out: &mut Vec<u8>,
) -> Result<Parsed<RawHead>, WireError> {
    let read = parse_head(buf, |start, fields| write_head(start, fields, method, out))?;
    Ok(match read {
        Parsed::Final((start, head)) => {
            let _ = buf.split_to(start.len);
            Parsed::Final(head)
        }
        Parsed::Partial => Parsed::Partial,
        Parsed::Interim => Parsed::Interim,
    })
}

/// A final head's fields judged and written for the client into `out`.
fn write_head(
    start: &Start,
    fields: &[httparse::Header<'_>],
    method: &Method,
    out: &mut Vec<u8>,
) -> Result<RawHead, WireError> {
    let (code, status, version) = (start.code, start.status, start.version);
    let mut framing = FramingFields::default();
    for field in fields {
        framing.see(field.name.as_bytes(), field.value);
    }
    let framing_of = response_framing(code, method, version, &framing)?;
    let keep_alive = framing_of != Framing::UntilClose
        && !framing.close
        && (version != Version::HTTP_10 || framing.keep_alive);
    let named = if framing.names_fields {
        connection_names(fields)
    } else {
        Vec::new()
    };
    out.extend_from_slice(match version {
        Version::HTTP_10 => b"HTTP/1.0 ",
        _ => b"HTTP/1.1 ",
    });
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut dated = false;
    for field in fields {
        let name = field.name.as_bytes();
        if crate::hops::hop_by_hop(name).is_some()
            || named.iter().any(|n| n.eq_ignore_ascii_case(name))
            || name.eq_ignore_ascii_case(b"content-length")
        {
            continue;
        }
        dated |= name.eq_ignore_ascii_case(b"date");
        crate::upstream::sent::field(out, name, field.value);
    }
    Ok(RawHead {
        status,
        framing: framing_of,
        keep_alive,
        dated,
        http10: version == Version::HTTP_10,
        // Beside a transfer coding, the length describes nothing (RFC 9112 §6.1).
        declared: framing
            .length
            .and_then(Result::ok)
            .filter(|_| framing.coding.is_none()),
    })
}

/// The field names a response's `Connection` lists (besides `keep-alive`).
fn connection_names<'h>(headers: &[httparse::Header<'h>]) -> Vec<&'h [u8]> {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| h.value.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|n| !n.is_empty() && !n.eq_ignore_ascii_case(b"keep-alive"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str, method: Method) -> (Result<Parsed<RawHead>, WireError>, String) {
        let mut buf = BytesMut::from(raw);
        let mut out = Vec::new();
        let parsed = parse_response(&mut buf, &method, &mut out);
        (parsed, String::from_utf8(out).unwrap())
    }

    fn head(raw: &str, method: Method) -> (RawHead, String) {
        match parse(raw, method) {
            (Ok(Parsed::Final(h)), out) => (h, out),
            (other, _) => panic!("{other:?}"),
        }
    }

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_cut() {
        let (h, out) = head(
            "HTTP/1.1 201 Whatever\r\nContent-Type: a/b\r\nConnection: x-secret, keep-alive\r\n\
             X-Secret: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\nDate: d\r\n\r\nok",
            Method::POST,
        );
        assert_eq!(
            out,
            "HTTP/1.1 201 Created\r\ncontent-type: a/b\r\ndate: d\r\n"
        );
        assert_eq!(h.framing, Framing::Length(2));
        assert!(h.keep_alive && h.dated);
    }

    #[test]
    fn a_chunked_answer_loses_its_framing_fields_and_an_unknown_status_its_reason() {
        let (h, out) = head(
            "HTTP/1.1 599 Odd\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n",
            Method::GET,
        );
        assert_eq!(out, "HTTP/1.1 599 <none>\r\n");
        assert_eq!(h.framing, Framing::Chunked);
        assert!(!h.dated);
        let (h, out) = head("HTTP/1.0 200 OK\r\n\r\n", Method::GET);
        assert_eq!(out, "HTTP/1.0 200 OK\r\n");
        assert_eq!(h.framing, Framing::UntilClose);
        assert!(!h.keep_alive && h.http10);
        let (h, _) = head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", Method::HEAD);
        assert_eq!(h.framing, Framing::Length(0));
        assert_eq!(h.declared, Some(5));
        // A length `Connection` names is still the body's: the client's is written from
        // the framing.
        let (h, out) = head(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: content-length\r\n\r\n",
            Method::GET,
        );
        assert_eq!(out, "HTTP/1.1 200 OK\r\n");
        assert_eq!(h.framing, Framing::Length(5));
    }

    #[test]
    fn written_fields_read_back_as_the_head_had_them() {
        let raw = "HTTP/1.1 201 Created\r\nContent-Type: a/b\r\nX-Multi: 1\r\nx-multi: 2: two\r\n\
                   X-Empty:\r\nContent-Length: 2\r\nDate: d\r\n\r\nok";
        let (h, out) = head(raw, Method::POST);
        let fields: Vec<_> = written_fields(after_status_line(out.as_bytes())).collect();
        let want: [(&[u8], &[u8]); 5] = [
            (b"content-type", b"a/b"),
            (b"x-multi", b"1"),
            (b"x-multi", b"2: two"),
            (b"x-empty", b""),
            (b"date", b"d"),
        ];
        assert_eq!(fields, want);
        // As a header map: the same fields, and the length back.
        let parts = h.parts(out.as_bytes());
        assert_eq!(parts.status, StatusCode::CREATED);
        assert_eq!(parts.version, Version::HTTP_11);
        let map: Vec<_> = parts
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            map,
            [
                ("content-type", "a/b"),
                ("x-multi", "1"),
                ("x-multi", "2: two"),
                ("x-empty", ""),
                ("date", "d"),
                ("content-length", "2"),
            ]
        );
        assert!(has_written_field(out.as_bytes(), b"x-multi"));
        assert!(has_written_field(out.as_bytes(), b"date"));
        assert!(!has_written_field(out.as_bytes(), b"created"));
        assert!(!has_written_field(out.as_bytes(), b"two"));
        let (h, out) = head("HTTP/1.0 200 OK\r\n\r\n", Method::GET);
        assert_eq!(h.parts(out.as_bytes()).version, Version::HTTP_10);
        assert_eq!(written_fields(after_status_line(out.as_bytes())).count(), 0);
    }

    #[test]
    fn interim_answers_are_skipped_and_partial_heads_write_nothing() {
        let mut buf = BytesMut::from("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 2");
        let mut out = Vec::new();
        assert!(matches!(
            parse_response(&mut buf, &Method::GET, &mut out),
            Ok(Parsed::Interim)
        ));
        assert!(matches!(
            parse_response(&mut buf, &Method::GET, &mut out),
            Ok(Parsed::Partial)
        ));
        assert!(out.is_empty());
        assert!(matches!(
            parse("HTTP/1.1 101 Switching\r\n\r\n", Method::GET).0,
            Err(WireError::Malformed(_))
        ));
        assert!(matches!(
            parse("HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", Method::GET).0,
            Err(WireError::Malformed(_))
        ));
    }
}
