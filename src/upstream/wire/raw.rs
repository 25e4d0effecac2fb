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
        if crate::upstream::hop_by_hop(name).is_some()
            || named.iter().any(|n| n.eq_ignore_ascii_case(name))
            || name.eq_ignore_ascii_case(b"content-length")
        {
            continue;
        }
        dated |= name.eq_ignore_ascii_case(b"date");
        let at = out.len();
        out.extend_from_slice(name);
        out[at..].make_ascii_lowercase();
        out.extend_from_slice(b": ");
        out.extend_from_slice(field.value);
        out.extend_from_slice(b"\r\n");
    }
    Ok(RawHead {
        status,
        framing: framing_of,
        keep_alive,
        dated,
        http10: version == Version::HTTP_10,
        declared: framing.length.and_then(Result::ok),
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
