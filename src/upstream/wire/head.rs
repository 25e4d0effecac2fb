//! The message heads of the upstream exchange, as pure functions over bytes: a request
//! head encoded with its framing chosen, a response head parsed with its body's framing.
//!
//! The framing rules are hyper's client's (`proto::h1::role::Client`), which the pool
//! used before, so an upstream sees the same requests: a header the request already
//! carries (`Content-Length`, or a `Transfer-Encoding` ending in `chunked`) is kept; a
//! body of known length gets `Content-Length`; one of unknown length is chunked, except
//! after `GET`, `HEAD` and `CONNECT`, which send none; an empty body sends no framing
//! header at all.

use std::mem::MaybeUninit;

use bytes::BytesMut;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::request::Parts;
use http::{Method, StatusCode, Version};

use super::WireError;

/// The most header fields a response head may have (hyper's default).
pub(super) const MAX_HEADERS: usize = 100;
/// The largest response head taken (hyper's default buffer limit).
pub(super) const MAX_HEAD: usize = 8192 + 4096 * 100;

/// How a request body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Send {
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked, ended by a last chunk (and the trailers, if any).
    Chunked,
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Exactly this many bytes (zero: no body).
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Everything until the upstream closes the connection.
    UntilClose,
}

/// Chooses the request body's framing and sets its header, as hyper's client does.
/// `known` is the body's exact length when it has one; `None` for `empty` is a body
/// already at its end.
pub(super) fn frame_request(parts: &mut Parts, empty: bool, known: Option<u64>) -> Send {
    let headers = &mut parts.headers;
    if empty {
        headers.remove(TRANSFER_ENCODING);
        return Send::Length(0);
    }
    let fields = FramingFields::of(headers);
    if let Some(chunked) = fields.coding {
        if !chunked {
            headers.append(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        }
        if fields.length.is_some() {
            headers.remove(CONTENT_LENGTH);
        }
        return Send::Chunked;
    }
    if let Some(Ok(len)) = fields.length {
        return Send::Length(len);
    }
    match known {
        Some(len) => {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
            Send::Length(len)
        }
        None if matches!(parts.method, Method::GET | Method::HEAD | Method::CONNECT) => {
            Send::Length(0)
        }
        None => {
            // Never beside a `Content-Length` (one that did not parse): a message framed
            // two ways is how requests are smuggled.
            headers.remove(CONTENT_LENGTH);
            headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
            Send::Chunked
        }
    }
}

/// The request line and headers, in origin form over HTTP/1.1.
pub(super) fn encode_request(parts: &Parts) -> Vec<u8> {
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let target = if target.is_empty() { "/" } else { target };
    let fields: usize = parts
        .headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum();
    let mut out = Vec::with_capacity(parts.method.as_str().len() + target.len() + fields + 16);
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    encode_fields(&parts.headers, &mut out);
    out.extend_from_slice(b"\r\n");
    out
}

/// `name: value` lines, as a head or a trailer section carries them.
pub(super) fn encode_fields(headers: &HeaderMap, out: &mut Vec<u8>) {
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// A parsed response head.
#[derive(Debug)]
pub(super) struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// The connection may carry another request once this response is read.
    pub keep_alive: bool,
}

/// What parsing the start of the read buffer found.
#[derive(Debug)]
pub(super) enum Parsed<H = ResponseHead> {
    /// More bytes are needed.
    Partial,
    /// An informational (1xx) response, skipped.
    Interim,
    /// The final response's head.
    Final(H),
}

/// A final response head's start, read.
pub(super) struct Start {
    /// The head's length, its blank line included.
    pub len: usize,
    pub code: u16,
    pub status: StatusCode,
    pub version: Version,
    /// Where the buffer the fields point into starts.
    pub base: usize,
}

/// Parses the response head at the start of `buf` (the bytes read so far): an
/// informational one is taken out of `buf` and skipped; a final one's start and fields go
/// to `fields`, whose answer comes back with the start (the head still in `buf`). Both
/// exchanges read heads so: into a header map ([`parse_response`]) or into the client's
/// bytes (`raw`).
pub(super) fn parse_head<T>(
    buf: &mut BytesMut,
    fields: impl FnOnce(&Start, &[httparse::Header<'_>]) -> Result<T, WireError>,
) -> Result<Parsed<(Start, T)>, WireError> {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buf,
        &mut slots,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(WireError::HeadTooLarge)
        }
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err(WireError::HeadTooLarge),
        Err(e) => return Err(WireError::Malformed(e.to_string())),
    };
    let code = response.code.unwrap_or(0);
    let status = StatusCode::from_u16(code)
        .map_err(|_| WireError::Malformed(format!("status code {code}")))?;
    match code {
        101 => return Err(WireError::Malformed("an upgrade nobody asked for".into())),
        100..=199 => {
            let _ = buf.split_to(len);
            return Ok(Parsed::Interim);
        }
        _ => {}
    }
    let version = if response.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let start = Start {
        len,
        code,
        status,
        version,
        base: buf.as_ptr() as usize,
    };
    let answer = fields(&start, response.headers)?;
    Ok(Parsed::Final((start, answer)))
}

/// Parses the response head at the start of `buf` (the bytes read so far), for a request
/// made with `method`, and takes it out of `buf`: header values keep its memory.
pub(super) fn parse_response(buf: &mut BytesMut, method: &Method) -> Result<Parsed, WireError> {
    let read = parse_head(buf, |start, fields| {
        let mut spans = Vec::with_capacity(fields.len());
        let mut framing = FramingFields::default();
        // Where each field is in `buf`, so the values can share it once it is split off; the
        // framing fields are read on the way, without looking them up again. Hop-by-hop
        // fields are read for the framing and go no further (RFC 9110 §7.6.1): the map never
        // holds them, so no one strips them from it. `Connection` stays only when it names
        // other fields, which then go with it.
        for field in fields {
            let name = HeaderName::from_bytes(field.name.as_bytes())
                .map_err(|_| WireError::Malformed(format!("header name {:?}", field.name)))?;
            framing.see(name.as_str().as_bytes(), field.value);
            let hop = crate::hops::hop_by_hop(field.name.as_bytes());
            if hop.is_some_and(|i| i != 0) {
                continue;
            }
            let at = field.value.as_ptr() as usize - start.base;
            spans.push((name, at..at + field.value.len(), hop.is_some()));
        }
        Ok((spans, framing))
    })?;
    let (start, (spans, framing)) = match read {
        Parsed::Final(read) => read,
        Parsed::Partial => return Ok(Parsed::Partial),
        Parsed::Interim => return Ok(Parsed::Interim),
    };
    let Start {
        len,
        code,
        status,
        version,
        ..
    } = start;
    let head = buf.split_to(len).freeze();
    let mut headers = HeaderMap::with_capacity(spans.len());
    for (name, span, connection) in spans {
        if connection && !framing.names_fields {
            continue;
        }
        let value = HeaderValue::from_maybe_shared(head.slice(span))
            .map_err(|_| WireError::Malformed(format!("the value of {name}")))?;
        headers.append(name, value);
    }
    if framing.names_fields {
        crate::hops::strip_hop_by_hop(&mut headers);
    }
    // The length crosses only where it framed the body (RFC 9112 §6.1), as one number.
    crate::hops::response_length(&mut headers, framing.coding.is_some())
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    let framing_of = response_framing(code, method, version, &framing)?;
    // `close` wins, whatever else `Connection` lists.
    let keep_alive = framing_of != Framing::UntilClose
        && !framing.close
        && (version != Version::HTTP_10 || framing.keep_alive);
    Ok(Parsed::Final(ResponseHead {
        status,
        version,
        headers,
        framing: framing_of,
        keep_alive,
    }))
}

/// What a response head's framing fields say.
#[derive(Default)]
pub(super) struct FramingFields {
    /// Every `Content-Length` value: `Err` when one is not a number or two disagree.
    pub(super) length: Option<Result<u64, ()>>,
    /// A `Transfer-Encoding` was there; whether its last coding is `chunked`.
    pub(super) coding: Option<bool>,
    /// `Connection` says `close`; says `keep-alive`; names anything but `keep-alive`
    /// (those fields are hop-by-hop then too; `close` is read as a name as well, as
    /// [`strip_hop_by_hop`](crate::hops::strip_hop_by_hop) reads it).
    pub(super) close: bool,
    pub(super) keep_alive: bool,
    pub(super) names_fields: bool,
}

impl FramingFields {
    /// Reads one field (`name` in any case).
    #[inline]
    pub(super) fn see(&mut self, name: &[u8], value: &[u8]) {
        // By length first: most names are none of the three's.
        let is = |known: &[u8]| name.len() == known.len() && name.eq_ignore_ascii_case(known);
        if !matches!(name.len(), 10 | 14 | 17) {
            return;
        }
        if is(b"content-length") {
            self.length = Some(match (self.length, parse_length(value)) {
                (Some(Err(())), _) | (_, Err(())) => Err(()),
                (Some(Ok(a)), Ok(b)) if a != b => Err(()),
                (_, Ok(b)) => Ok(b),
            });
        } else if is(b"transfer-encoding") {
            let last = value.rsplit(|b| *b == b',').next().unwrap_or_default();
            self.coding = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if is(b"connection") {
            for token in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                let close = token.eq_ignore_ascii_case(b"close");
                let keep_alive = token.eq_ignore_ascii_case(b"keep-alive");
                self.close |= close;
                self.keep_alive |= keep_alive;
                self.names_fields |= !(keep_alive || token.is_empty());
            }
        }
    }
}

/// RFC 9112 §6.3, for a response: which body it has.
pub(super) fn response_framing(
    code: u16,
    method: &Method,
    version: Version,
    fields: &FramingFields,
) -> Result<Framing, WireError> {
    if matches!(code, 204 | 304) || *method == Method::HEAD {
        return Ok(Framing::Length(0));
    }
    if *method == Method::CONNECT && (200..300).contains(&code) {
        return Err(WireError::Malformed("a tunnel nobody asked for".into()));
    }
    if let Some(chunked) = fields.coding {
        if version == Version::HTTP_10 {
            return Err(WireError::Malformed(
                "Transfer-Encoding in an HTTP/1.0 response".into(),
            ));
        }
        return Ok(if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        });
    }
    match fields.length {
        Some(Ok(len)) => Ok(Framing::Length(len)),
        Some(Err(())) => Err(WireError::Malformed("an invalid Content-Length".into())),
        None => Ok(Framing::UntilClose),
    }
}

/// One `Content-Length` field: a number, or a list of the same number.
fn parse_length(value: &[u8]) -> Result<u64, ()> {
    let mut found = None;
    for part in value.split(|b| *b == b',') {
        let part = part.trim_ascii();
        if part.is_empty() || part.len() > 19 {
            return Err(());
        }
        let mut len: u64 = 0;
        for b in part {
            if !b.is_ascii_digit() {
                return Err(());
            }
            len = len * 10 + u64::from(b - b'0');
        }
        match found {
            Some(seen) if seen != len => return Err(()),
            _ => found = Some(len),
        }
    }
    found.ok_or(())
}

impl FramingFields {
    /// What a request's own framing fields say.
    fn of(headers: &HeaderMap) -> Self {
        let mut fields = Self::default();
        for name in [CONTENT_LENGTH, TRANSFER_ENCODING] {
            for value in headers.get_all(&name) {
                fields.see(name.as_str().as_bytes(), value.as_bytes());
            }
        }
        fields
    }
}

#[cfg(test)]
mod tests;
