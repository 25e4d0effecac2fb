//! HTTP/1.1 as bytes on the wire, read strictly: the tests that judge framing read what a
//! proxy wrote with these readers, never with a library that might forgive the very fault
//! under test. Responses are framed by RFC 9112 §6.3; every way a message is malformed
//! (two lengths, a length beside `Transfer-Encoding`, a bare CR or LF, an obs-fold, a NUL,
//! a bad name, a broken chunk) is named, not repaired.

/// One header field as sent: its name lowercased, its value with the surrounding
/// whitespace trimmed.
pub type Field = (String, Vec<u8>);

/// One final response read off a connection.
#[derive(Debug, Clone)]
pub struct WireResponse {
    /// The status code.
    pub status: u16,
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub version: String,
    /// The header fields, in order.
    pub fields: Vec<Field>,
    /// The body, dechunked.
    pub body: Vec<u8>,
    /// The statuses of the interim (1xx) responses that came before it.
    pub interim: Vec<u16>,
}

impl WireResponse {
    /// Every value of the field `name` (any case), in order.
    pub fn values(&self, name: &str) -> Vec<String> {
        values(&self.fields, name)
    }

    /// The first value of the field `name`, if any.
    pub fn value(&self, name: &str) -> Option<String> {
        self.values(name).into_iter().next()
    }

    /// The body as text, for messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Every value of the field `name` in `fields`.
pub fn values(fields: &[Field], name: &str) -> Vec<String> {
    fields
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .collect()
}

/// How a stream of responses ended, after the last whole one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEnd {
    /// Nothing is left over.
    Clean,
    /// A message began but is not whole: the connection ended or went quiet inside it.
    Incomplete(Vec<u8>),
    /// A message is malformed: what is wrong, and the bytes from its start.
    Malformed(String, Vec<u8>),
}

/// Reads every response in `bytes`. `methods[i]` is the method of the request the `i`th
/// final response answers (a `HEAD` answer has no body; past the list, `GET`); `closed`
/// says the connection ended after these bytes, which is what ends a body of unstated
/// length.
pub fn read_responses(
    bytes: &[u8],
    methods: &[&str],
    closed: bool,
) -> (Vec<WireResponse>, StreamEnd) {
    let mut out = Vec::new();
    let mut at = 0;
    let mut interim = Vec::new();
    while at < bytes.len() {
        let method = methods.get(out.len()).copied().unwrap_or("GET");
        match read_response(&bytes[at..], method, closed) {
            Step::Done(mut r, used) => {
                at += used;
                if (100..200).contains(&r.status) && r.status != 101 {
                    interim.push(r.status);
                    continue;
                }
                r.interim = std::mem::take(&mut interim);
                out.push(r);
            }
            Step::More => return (out, StreamEnd::Incomplete(bytes[at..].to_vec())),
            Step::Bad(why) => return (out, StreamEnd::Malformed(why, bytes[at..].to_vec())),
        }
    }
    (out, StreamEnd::Clean)
}

enum Step<T> {
    Done(T, usize),
    More,
    Bad(String),
}

fn read_response(b: &[u8], method: &str, closed: bool) -> Step<WireResponse> {
    let Some(end) = find(b, b"\r\n\r\n") else {
        return Step::More;
    };
    let head = &b[..end];
    let mut lines = head.split_inclusive_crlf();
    let status_line = lines.next().unwrap_or_default();
    let Some((version, status)) = status_line_parts(status_line) else {
        return Step::Bad(format!("status line {:?}", show(status_line)));
    };
    let fields = match parse_fields(lines) {
        Ok(f) => f,
        Err(e) => return Step::Bad(e),
    };
    let body_at = end + 4;
    let te = values(&fields, "transfer-encoding");
    let cl = values(&fields, "content-length");
    if ((100..200).contains(&status) || status == 204) && (!te.is_empty() || !cl.is_empty()) {
        return Step::Bad(format!(
            "a {status} answer with Transfer-Encoding {te:?} or Content-Length {cl:?}"
        ));
    }
    let mut r = WireResponse {
        status,
        version,
        fields,
        body: Vec::new(),
        interim: Vec::new(),
    };
    if method.eq_ignore_ascii_case("HEAD")
        || (100..200).contains(&status)
        || status == 204
        || status == 304
    {
        return Step::Done(r, body_at);
    }
    let rest = &b[body_at..];
    if !te.is_empty() {
        if !cl.is_empty() {
            return Step::Bad(format!(
                "Content-Length {cl:?} beside Transfer-Encoding {te:?}"
            ));
        }
        let codings = codings(&te);
        if codings.last().map(String::as_str) != Some("chunked") {
            return close_delimited(r, rest, body_at, closed);
        }
        return match dechunk(rest) {
            Step::Done(body, used) => {
                r.body = body;
                Step::Done(r, body_at + used)
            }
            Step::More => Step::More,
            Step::Bad(e) => Step::Bad(e),
        };
    }
    if !cl.is_empty() {
        let n = match single_length(&cl) {
            Ok(n) => n,
            Err(e) => return Step::Bad(e),
        };
        if (rest.len() as u64) < n {
            return Step::More;
        }
        r.body = rest[..n as usize].to_vec();
        return Step::Done(r, body_at + n as usize);
    }
    close_delimited(r, rest, body_at, closed)
}

fn close_delimited(
    mut r: WireResponse,
    rest: &[u8],
    body_at: usize,
    closed: bool,
) -> Step<WireResponse> {
    if !closed {
        return Step::More;
    }
    r.body = rest.to_vec();
    Step::Done(r, body_at + rest.len())
}

/// The one length a `Content-Length` field list states: exactly one value of digits.
pub fn single_length(values: &[String]) -> Result<u64, String> {
    let all: Vec<&str> = values.iter().flat_map(|v| v.split(',')).collect();
    if all.len() != 1 {
        return Err(format!(
            "Content-Length with {} values: {values:?}",
            all.len()
        ));
    }
    let v = all[0].trim_matches([' ', '\t']);
    if v.is_empty() || !v.bytes().all(|c| c.is_ascii_digit()) {
        return Err(format!("Content-Length {v:?} is not digits"));
    }
    v.parse()
        .map_err(|_| format!("Content-Length {v:?} overflows"))
}

/// The transfer codings a `Transfer-Encoding` field list names, lowercased, empty list
/// elements skipped.
pub fn codings(values: &[String]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(|c| c.trim_matches([' ', '\t']).to_ascii_lowercase())
        .filter(|c| !c.is_empty())
        .collect()
}

fn status_line_parts(line: &[u8]) -> Option<(String, u16)> {
    let line = std::str::from_utf8(line).ok()?;
    let (version, rest) = line.split_once(' ')?;
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return None;
    }
    let code = rest.get(..3)?;
    if !code.bytes().all(|c| c.is_ascii_digit()) || !(rest.len() == 3 || rest[3..].starts_with(' '))
    {
        return None;
    }
    if rest.bytes().any(|c| c.is_ascii_control() && c != b'\t') {
        return None;
    }
    Some((version.to_owned(), code.parse().ok()?))
}

/// Whether `c` may appear in a field name (a token, RFC 9110 §5.6.2).
pub fn tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// The field lines of a head (after its start line), each checked: no bare CR or LF, no
/// obs-fold, a token name right before the colon, no control byte but HTAB in the value.
fn parse_fields<'a>(lines: impl Iterator<Item = &'a [u8]>) -> Result<Vec<Field>, String> {
    let mut out = Vec::new();
    for line in lines {
        out.push(parse_field(line)?);
    }
    Ok(out)
}

fn parse_field(line: &[u8]) -> Result<Field, String> {
    if let Some(c) = line.iter().find(|&&c| c == b'\r' || c == b'\n') {
        let which = if *c == b'\r' { "CR" } else { "LF" };
        return Err(format!("a bare {which} in the field line {:?}", show(line)));
    }
    if line.first().is_some_and(|c| *c == b' ' || *c == b'\t') {
        return Err(format!("an obs-fold line {:?}", show(line)));
    }
    let Some(colon) = line.iter().position(|&c| c == b':') else {
        return Err(format!("a field line without a colon {:?}", show(line)));
    };
    let name = &line[..colon];
    if name.is_empty() || !name.iter().all(|&c| tchar(c)) {
        return Err(format!("a field name that is no token {:?}", show(line)));
    }
    let value = trim_ows(&line[colon + 1..]);
    if let Some(c) = value
        .iter()
        .find(|&&c| (c < 0x20 && c != b'\t') || c == 0x7f)
    {
        return Err(format!(
            "a control byte 0x{c:02x} in the field value {:?}",
            show(line)
        ));
    }
    Ok((
        String::from_utf8_lossy(name).to_ascii_lowercase(),
        value.to_vec(),
    ))
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// A chunked body read strictly (RFC 9112 §7.1): sizes of at most 16 hex digits, an
/// extension only after `;`, CRLF after every line and every chunk's data, trailer fields
/// checked as header fields. The body, and how many bytes it took.
fn dechunk(b: &[u8]) -> Step<Vec<u8>> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(eol) = find(&b[at..], b"\r\n") else {
            return Step::More;
        };
        let line = &b[at..at + eol];
        let size_end = line
            .iter()
            .position(|&c| !c.is_ascii_hexdigit())
            .unwrap_or(line.len());
        let (size, ext) = line.split_at(size_end);
        if size.is_empty() || size.len() > 16 {
            return Step::Bad(format!("a chunk-size line {:?}", show(line)));
        }
        let ext = trim_ows(ext);
        if !(ext.is_empty() || ext.starts_with(b";"))
            || ext.iter().any(|&c| c == b'\r' || c == b'\n' || c == 0)
        {
            return Step::Bad(format!("a chunk-size line {:?}", show(line)));
        }
        let n = u64::from_str_radix(std::str::from_utf8(size).unwrap(), 16).unwrap();
        at += eol + 2;
        if n == 0 {
            // The trailer section, to its empty line.
            loop {
                let Some(eol) = find(&b[at..], b"\r\n") else {
                    return Step::More;
                };
                let line = &b[at..at + eol];
                at += eol + 2;
                if line.is_empty() {
                    return Step::Done(body, at);
                }
                if let Err(e) = parse_field(line) {
                    return Step::Bad(format!("trailer: {e}"));
                }
            }
        }
        if ((b.len() - at) as u64) < n + 2 {
            return Step::More;
        }
        let n = n as usize;
        body.extend_from_slice(&b[at..at + n]);
        if &b[at + n..at + n + 2] != b"\r\n" {
            return Step::Bad(format!(
                "chunk data not followed by CRLF: {:?}",
                show(&b[at + n..(at + n + 8).min(b.len())])
            ));
        }
        at += n + 2;
    }
}

/// One request read off an upstream connection, with every fault of its head.
#[derive(Debug, Clone)]
pub struct WireRequest {
    /// The method.
    pub method: String,
    /// The request target.
    pub target: String,
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub version: String,
    /// The header fields, in order (as read, faulty ones included where they parse).
    pub fields: Vec<Field>,
    /// The body, dechunked.
    pub body: Vec<u8>,
    /// What is wrong with the head as a sender may write it: a message downstream
    /// parsers could each read differently.
    pub faults: Vec<String>,
    /// The head as sent, for messages.
    pub head: Vec<u8>,
}

impl WireRequest {
    /// Every value of the field `name` (any case).
    pub fn values(&self, name: &str) -> Vec<String> {
        values(&self.fields, name)
    }
}

/// What [`read_request`] found at the start of a buffer.
#[derive(Debug)]
pub enum RequestStep {
    /// A whole request, and how many bytes it took.
    Done(WireRequest, usize),
    /// Not whole yet; `expect_continue` when its head is whole and asks for `100 Continue`.
    More {
        /// The head is read and says `Expect: 100-continue`.
        expect_continue: bool,
    },
    /// Its framing cannot be read at all: the connection must end.
    Bad(String),
}

/// Reads one request at the start of `b` as an origin server that follows RFC 9112 would,
/// noting each fault of its head rather than forgiving it silently.
pub fn read_request(b: &[u8]) -> RequestStep {
    let Some(end) = find(b, b"\r\n\r\n") else {
        return RequestStep::More {
            expect_continue: false,
        };
    };
    let head = &b[..end];
    let mut lines = head.split_inclusive_crlf();
    let line = lines.next().unwrap_or_default();
    let text = String::from_utf8_lossy(line).into_owned();
    let parts: Vec<&str> = text.split(' ').collect();
    if parts.len() != 3 || !parts[2].starts_with("HTTP/1.") {
        return RequestStep::Bad(format!("request line {:?}", show(line)));
    }
    let mut faults = Vec::new();
    if line.iter().any(|&c| c.is_ascii_control()) {
        faults.push(format!(
            "a control byte in the request line {:?}",
            show(line)
        ));
    }
    let mut fields = Vec::new();
    for line in lines {
        match parse_field(line) {
            Ok(f) => fields.push(f),
            Err(e) => {
                faults.push(e);
                // Read it as leniently as a forgiving server would, for the framing.
                if let Some(colon) = line.iter().position(|&c| c == b':') {
                    let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
                    fields.push((name, trim_ows(&line[colon + 1..]).to_vec()));
                }
            }
        }
    }
    let te = values(&fields, "transfer-encoding");
    let cl = values(&fields, "content-length");
    if !te.is_empty() && !cl.is_empty() {
        faults.push(format!(
            "Content-Length {cl:?} beside Transfer-Encoding {te:?}"
        ));
    }
    let expect_continue = values(&fields, "expect")
        .iter()
        .any(|v| v.eq_ignore_ascii_case("100-continue"));
    let mut req = WireRequest {
        method: parts[0].to_owned(),
        target: parts[1].to_owned(),
        version: parts[2].to_owned(),
        fields,
        body: Vec::new(),
        faults,
        head: head.to_vec(),
    };
    let rest = &b[end + 4..];
    if !te.is_empty() {
        if codings(&te) != ["chunked"] {
            return RequestStep::Bad(format!("Transfer-Encoding {te:?} on a request"));
        }
        return match dechunk(rest) {
            Step::Done(body, used) => {
                req.body = body;
                RequestStep::Done(req, end + 4 + used)
            }
            Step::More => RequestStep::More { expect_continue },
            Step::Bad(e) => RequestStep::Bad(e),
        };
    }
    let n = if cl.is_empty() {
        0
    } else {
        match single_length(&cl) {
            Ok(n) => n,
            Err(e) => {
                req.faults.push(e);
                let all: Vec<u64> = cl
                    .iter()
                    .flat_map(|v| v.split(','))
                    .filter_map(|v| v.trim().parse().ok())
                    .collect();
                match all.first() {
                    Some(&n) if all.iter().all(|&m| m == n) => n,
                    _ => return RequestStep::Bad(format!("Content-Length {cl:?}")),
                }
            }
        }
    };
    if (rest.len() as u64) < n {
        return RequestStep::More { expect_continue };
    }
    req.body = rest[..n as usize].to_vec();
    RequestStep::Done(req, end + 4 + n as usize)
}

/// The first position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Bytes as printable text: `\r`, `\n`, `\0` and other non-printing bytes escaped.
pub fn show(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

/// Lines of a head split on CRLF (a bare CR or LF stays inside its line, to be judged).
trait CrlfLines {
    fn split_inclusive_crlf(&self) -> std::vec::IntoIter<&[u8]>;
}

impl CrlfLines for [u8] {
    fn split_inclusive_crlf(&self) -> std::vec::IntoIter<&[u8]> {
        let mut out = Vec::new();
        let mut rest = self;
        while let Some(i) = find(rest, b"\r\n") {
            out.push(&rest[..i]);
            rest = &rest[i + 2..];
        }
        out.push(rest);
        out.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_length_beside_chunked_is_malformed_and_a_clean_stream_reads_whole() {
        let two = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nSAFEHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\nnext\r\n0\r\nT: 1\r\n\r\n";
        let (rs, end) = read_responses(two, &["POST", "GET"], false);
        assert_eq!(end, StreamEnd::Clean);
        assert_eq!(rs.len(), 2);
        assert_eq!(
            (rs[0].interim.clone(), rs[0].text()),
            (vec![100], "SAFE".into())
        );
        assert_eq!(rs[1].text(), "next");
        let stale = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nSAFE\r\n0\r\n\r\n";
        assert!(matches!(
            read_responses(stale, &[], false).1,
            StreamEnd::Malformed(..)
        ));
        let two_lengths = b"HTTP/1.1 200 OK\r\nContent-Length: 4, 4\r\n\r\nSAFE";
        assert!(matches!(
            read_responses(two_lengths, &[], false).1,
            StreamEnd::Malformed(..)
        ));
    }

    #[test]
    fn a_request_s_faults_are_named() {
        let r = b"POST /a HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\nContent-Length: 2\r\n\r\nhi";
        let RequestStep::Done(req, used) = read_request(r) else {
            panic!("not read")
        };
        assert_eq!((req.body.as_slice(), used), (&b"hi"[..], r.len()));
        assert_eq!(req.faults.len(), 1, "{:?}", req.faults);
    }
}
