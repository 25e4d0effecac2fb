//! The framing corpus (issue 54): HTTP/1.1 framing mutations of requests and hostile
//! upstream answers, judged by what crosses the wire only, so it holds whichever HTTP stack
//! serves the gateway.
//!
//! Request side: each mutation is written raw on one connection, followed by a well-formed
//! `GET /after` (the last request, `Connection: close`), to a gateway in front of a
//! recording upstream that reads what it is sent strictly (`support::wire`). Each is sent
//! on a keyed route and on a passthrough path, in one segment and with the body in a
//! second. What must hold: every request the upstream saw was answered to this client, in
//! order, as the answer to the request the client sent at that place; its body is the one
//! RFC 9112 frames; nothing the client did not send as a request (`/smuggled`) reaches the
//! upstream; a head forwarded upstream is not ambiguous (no length beside
//! `Transfer-Encoding`, no two lengths, no obs-fold, no CR, LF or NUL in a value); after a
//! refusal, nothing more. nginx, where installed, gets the same bytes; where one refuses
//! and the other accepts, a table says so (that alone fails nothing).
//!
//! Response side: a scripted upstream answers each hostile answer; keyed POSTs (the winner,
//! then replays from the store) and passthrough requests, each followed on its connection
//! by `GET /other`, in one segment and with the body in a second. What must hold: each client reads exactly one well-framed answer per request
//! (read by a strict RFC 9112 §6.3 reader), the relayed one is the upstream's whole answer
//! or a refusal, and the answer to `GET /other` is the upstream's answer to it.
//!
//! Each family's test runs its cases concurrently, each case on a gateway and upstream of
//! its own, collects every failing case and fails once, naming them all.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dedupe_test_support::nginx::Nginx;
use dedupe_test_support::wire::{self, RequestStep, StreamEnd, WireRequest, WireResponse};
use dedupe_test_support::{GatewayConfig, RouteCfg, StoreCfg, TestGateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
const AFTER: &str = "GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
/// How the recording upstream names a request whose connection ended inside it.
const UNFINISHED: &str = "the connection ended inside a request";
const KEYED_PATH: &str = "/v1/orders/c";
const PASS_PATH: &str = "/pass";

/// How long a client waits for more bytes before it takes what it has.
const IDLE: Duration = Duration::from_millis(2500);
/// How long a client waits once it has every answer it expects, for bytes that should
/// not come.
const GRACE: Duration = Duration::from_millis(150);

async fn gateway(upstream: SocketAddr, upstream_timeout: &str) -> TestGateway {
    let cfg = GatewayConfig::new(format!("http://{upstream}"))
        .store(StoreCfg::memory())
        .upstream_timeout(upstream_timeout)
        // `scope = []` once the builder can write it (a header key is one caller's).
        .route(RouteCfg::header("orders", "/v1/orders/**").scope(&[]));
    TestGateway::start(&cfg).await
}

// ---------------------------------------------------------------------------------------
// The client.

/// What a client read on one connection.
struct Exchange {
    answers: Vec<WireResponse>,
    end: StreamEnd,
    /// The peer closed (or reset) the connection.
    closed: bool,
}

/// Writes `parts` on a new connection (`gap` between them), then reads until the peer
/// closes, goes quiet for [`IDLE`], or `want` final answers are whole and nothing more
/// comes within [`GRACE`]. `methods` are the requests' methods, in order.
async fn exchange(
    addr: SocketAddr,
    parts: &[Vec<u8>],
    gap: Duration,
    methods: &[&str],
) -> Exchange {
    let want = methods.len();
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut closed = false;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            // Read what comes meanwhile (an interim `100 Continue`, an early refusal).
            let until = tokio::time::Instant::now() + gap;
            while let Ok(r) = tokio::time::timeout_at(until, s.read(&mut chunk)).await {
                match r {
                    Ok(n @ 1..) => got.extend_from_slice(&chunk[..n]),
                    _ => {
                        closed = true;
                        break;
                    }
                }
            }
        }
        if closed || s.write_all(part).await.is_err() {
            break;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(8);
    while !closed && Instant::now() < deadline {
        let (answers, end) = wire::read_responses(&got, methods, false);
        let wait = if answers.len() >= want && end == StreamEnd::Clean {
            GRACE
        } else {
            IDLE
        };
        match tokio::time::timeout(wait, s.read(&mut chunk)).await {
            Ok(Ok(n @ 1..)) => got.extend_from_slice(&chunk[..n]),
            Ok(_) => closed = true,
            Err(_) => break,
        }
    }
    let (answers, end) = wire::read_responses(&got, methods, closed);
    Exchange {
        answers,
        end,
        closed,
    }
}

/// Where a message's head ends (after `\r\n\r\n`, or `\n\n` in a bare-LF case).
fn head_end(b: &[u8]) -> usize {
    match (wire::find(b, b"\r\n\r\n"), wire::find(b, b"\n\n")) {
        (Some(a), Some(b)) if b + 2 < a + 4 => b + 2,
        (Some(a), _) => a + 4,
        (None, Some(b)) => b + 2,
        (None, None) => b.len() / 2,
    }
}

// ---------------------------------------------------------------------------------------
// Request side: the recording upstream.

/// Every request an upstream read, in order, and what it could not read.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<WireRequest>>>,
    unreadable: Arc<Mutex<Vec<String>>>,
}

/// An upstream that reads requests strictly and answers each `200` with
/// `X-Seen: <index>` and a body naming it.
async fn recording_upstream() -> (SocketAddr, Recorder) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let rec = Recorder::default();
    let r = rec.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(record(s, r.clone()));
        }
    });
    (addr, rec)
}

async fn record(mut s: TcpStream, rec: Recorder) {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut continued = false;
    loop {
        match wire::read_request(&buf) {
            RequestStep::Done(req, used) => {
                buf.drain(..used);
                continued = false;
                let close = req
                    .values("connection")
                    .iter()
                    .any(|v| v.to_ascii_lowercase().contains("close"));
                let id = {
                    let mut seen = rec.seen.lock().unwrap();
                    seen.push(req);
                    seen.len() - 1
                };
                let body = format!("seen={id}");
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nX-Seen: {id}\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                if s.write_all(answer.as_bytes()).await.is_err() || close {
                    return;
                }
                continue;
            }
            RequestStep::More { expect_continue } => {
                if expect_continue && !continued {
                    continued = true;
                    let _ = s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await;
                }
            }
            RequestStep::Bad(why) => {
                rec.unreadable
                    .lock()
                    .unwrap()
                    .push(format!("{why} in {:?}", wire::show(&buf)));
                return;
            }
        }
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk)).await {
            Ok(Ok(n @ 1..)) => buf.extend_from_slice(&chunk[..n]),
            _ => {
                if !buf.is_empty() {
                    rec.unreadable
                        .lock()
                        .unwrap()
                        .push(format!("{UNFINISHED}: {:?}", wire::show(&buf)));
                }
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Request side: the cases.

/// How RFC 9112 reads a mutated request.
#[derive(Clone, Debug)]
enum Reading {
    /// A valid message with this body (a refusal is only noted).
    Valid(Vec<u8>),
    /// Refused, or read with this body.
    Either(Vec<u8>),
    /// Refused, or read (with this body, when given), and the connection closes after
    /// its answer: CL with TE, TE in HTTP/1.0 (RFC 9112 §6.1, §6.3).
    ThenClose(Option<Vec<u8>>),
    /// Invalid: the RFC has it refused (an acceptance is only noted).
    Refuse,
    /// The RFC allows more than one reading: only that the answers match the upstream's.
    Any,
    /// A replay of the answer to the request at this index.
    ReplayOf(usize),
}

/// One request of a case, as the RFC reads the client's bytes.
#[derive(Clone, Debug)]
struct Want {
    method: &'static str,
    /// `{P}` is the case's path.
    path: &'static str,
    reading: Reading,
}

#[derive(Clone)]
struct Mutation {
    name: String,
    /// `{P}`: the path; `{K}`: the key field line on the keyed route, nothing elsewhere.
    bytes: Vec<u8>,
    wants: Vec<Want>,
    /// Run on the keyed route only.
    keyed_only: bool,
    /// Where the second segment starts, when not at the first head's end.
    split_at: Option<usize>,
}

fn post(reading: Reading) -> Want {
    Want {
        method: "POST",
        path: "{P}",
        reading,
    }
}

fn get(path: &'static str) -> Want {
    Want {
        method: "GET",
        path,
        reading: Reading::Valid(Vec::new()),
    }
}

/// A POST with `fields` (each line ending in CRLF) and `body`, then `GET /after`.
fn m(name: &str, fields: &str, body: &[u8], reading: Reading) -> Mutation {
    let mut bytes = format!("POST {{P}} HTTP/1.1\r\nHost: x\r\n{{K}}{fields}\r\n").into_bytes();
    bytes.extend_from_slice(body);
    raw(name, bytes, vec![post(reading), get("/after")])
}

fn raw(name: &str, mut bytes: Vec<u8>, wants: Vec<Want>) -> Mutation {
    bytes.extend_from_slice(AFTER.as_bytes());
    Mutation {
        name: name.to_owned(),
        bytes,
        wants,
        keyed_only: false,
        split_at: None,
    }
}

fn chunked(data: &[u8]) -> Vec<u8> {
    let mut b = format!("{:x}\r\n", data.len()).into_bytes();
    b.extend_from_slice(data);
    b.extend_from_slice(b"\r\n0\r\n\r\n");
    b
}

/// The body most cases carry: a whole request, so a framing that stops early smuggles it.
fn d() -> Vec<u8> {
    SMUGGLED.as_bytes().to_vec()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn cl_te_family() -> Vec<Mutation> {
    use Reading::*;
    let (d, t) = (d(), chunked(&d()));
    let tl = t.len();
    let zero = cat(&[b"0\r\n\r\n", SMUGGLED.as_bytes()]);
    vec![
        m(
            "cl_long_then_te",
            &format!("Content-Length: {tl}\r\nTransfer-Encoding: chunked\r\n"),
            &t,
            ThenClose(Some(d.clone())),
        ),
        m(
            "te_then_cl_long",
            &format!("Transfer-Encoding: chunked\r\nContent-Length: {tl}\r\n"),
            &t,
            ThenClose(Some(d.clone())),
        ),
        m(
            "cl_short_then_te",
            "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
            &t,
            ThenClose(Some(d.clone())),
        ),
        m(
            "te_then_cl_short",
            "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
            &t,
            ThenClose(Some(d.clone())),
        ),
        m(
            "cl_zero_then_te",
            "Content-Length: 0\r\nTransfer-Encoding: chunked\r\n",
            &t,
            ThenClose(Some(d.clone())),
        ),
        // TE reads an empty body; what follows must not be served on this connection.
        m(
            "cl_covers_smuggled_then_te",
            &format!(
                "Content-Length: {}\r\nTransfer-Encoding: chunked\r\n",
                zero.len()
            ),
            &zero,
            ThenClose(Some(Vec::new())),
        ),
        m(
            "te_then_cl_covers_smuggled",
            &format!(
                "Transfer-Encoding: chunked\r\nContent-Length: {}\r\n",
                zero.len()
            ),
            &zero,
            ThenClose(Some(Vec::new())),
        ),
        m(
            "cl_then_te_obfuscated_space",
            &format!("Content-Length: {tl}\r\nTransfer-Encoding:  chunked\r\n"),
            &t,
            ThenClose(Some(d.clone())),
        ),
        m(
            "cl_then_te_upper",
            &format!("Content-Length: {tl}\r\nTransfer-Encoding: CHUNKED\r\n"),
            &t,
            ThenClose(Some(d.clone())),
        ),
        m(
            "te_identity_with_cl",
            &format!(
                "Transfer-Encoding: identity\r\nContent-Length: {}\r\n",
                d.len()
            ),
            &d,
            Refuse,
        ),
        m(
            "te_http10_with_cl",
            &format!("Transfer-Encoding: chunked\r\nContent-Length: {tl}\r\n"),
            &t,
            ThenClose(None),
        )
        .http10(),
        m(
            "te_http10",
            "Transfer-Encoding: chunked\r\n",
            &t,
            ThenClose(None),
        )
        .http10(),
    ]
}

fn te_family() -> Vec<Mutation> {
    use Reading::*;
    let (d, t) = (d(), chunked(&d()));
    let te = |name: &str, value: &str, reading: Reading| {
        m(name, &format!("Transfer-Encoding:{value}\r\n"), &t, reading)
    };
    vec![
        te("chunked_identity", " chunked, identity", Refuse),
        te("identity_chunked", " identity, chunked", Either(d.clone())),
        te("leading_space", "  chunked", Valid(d.clone())),
        te("no_space", "chunked", Valid(d.clone())),
        te("trailing_space", " chunked ", Valid(d.clone())),
        te("tab", "\tchunked", Valid(d.clone())),
        te("capital", " Chunked", Valid(d.clone())),
        te("upper", " CHUNKED", Valid(d.clone())),
        te("empty_element", " , chunked", Valid(d.clone())),
        te("xchunked", " xchunked", Refuse),
        te("chunkedx", " chunkedx", Refuse),
        te("quoted", " \"chunked\"", Refuse),
        te("chunked_twice", " chunked, chunked", Refuse),
        te("vertical_tab", "\x0bchunked", Refuse),
        te("form_feed", " \x0cchunked", Refuse),
        m(
            "two_fields_chunked_identity",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
            &t,
            Refuse,
        ),
        m(
            "two_fields_identity_chunked",
            "Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n",
            &t,
            Either(d.clone()),
        ),
        m(
            "two_fields_chunked_chunked",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            &t,
            Refuse,
        ),
        m(
            "underscore_name_with_cl",
            &format!(
                "Transfer_Encoding: chunked\r\nContent-Length: {}\r\n",
                t.len()
            ),
            &t,
            Valid(t.clone()),
        ),
        m(
            "empty_value_with_cl",
            &format!("Transfer-Encoding: \r\nContent-Length: {}\r\n", d.len()),
            &d,
            Any,
        ),
        m(
            "gzip_chunked",
            "Transfer-Encoding: gzip, chunked\r\n",
            &t,
            Any,
        ),
    ]
}

fn length_family() -> Vec<Mutation> {
    use Reading::*;
    let d = d();
    let l = d.len();
    let cl = |name: &str, fields: String, reading: Reading| m(name, &fields, &d, reading);
    vec![
        cl(
            "duplicate_same",
            format!("Content-Length: {l}\r\nContent-Length: {l}\r\n"),
            Either(d.clone()),
        ),
        cl(
            "duplicate_differ",
            format!("Content-Length: {l}\r\nContent-Length: 3\r\n"),
            Refuse,
        ),
        cl(
            "duplicate_differ_short_first",
            format!("Content-Length: 3\r\nContent-Length: {l}\r\n"),
            Refuse,
        ),
        cl(
            "comma_same",
            format!("Content-Length: {l}, {l}\r\n"),
            Either(d.clone()),
        ),
        cl(
            "comma_differ",
            format!("Content-Length: 3, {l}\r\n"),
            Refuse,
        ),
        cl(
            "comma_empty_element",
            format!("Content-Length: {l},\r\n"),
            Any,
        ),
        cl(
            "zero_padded",
            format!("Content-Length: 000{l}\r\n"),
            Valid(d.clone()),
        ),
        cl("plus", format!("Content-Length: +{l}\r\n"), Refuse),
        cl("minus", "Content-Length: -1\r\n".into(), Refuse),
        cl("hex", format!("Content-Length: 0x{l:x}\r\n"), Refuse),
        cl(
            "decimal_point",
            format!("Content-Length: {l}.0\r\n"),
            Refuse,
        ),
        cl("exponent", format!("Content-Length: {l}e0\r\n"), Refuse),
        cl(
            "trailing_letter",
            format!("Content-Length: {l}x\r\n"),
            Refuse,
        ),
        cl(
            "space_inside",
            format!("Content-Length: {} {}\r\n", l / 10, l % 10),
            Refuse,
        ),
        cl(
            "ows_around",
            format!("Content-Length:  {l} \r\n"),
            Valid(d.clone()),
        ),
        cl("empty", "Content-Length: \r\n".into(), Refuse),
        cl(
            "u64_max",
            "Content-Length: 18446744073709551615\r\n".into(),
            Refuse,
        ),
        cl(
            "u64_overflow",
            format!("Content-Length: 1844674407370955161{}\r\n", 6 + l),
            Refuse,
        ),
        cl(
            "overflow_to_small",
            format!("Content-Length: 3689348814741910323{l}\r\n"),
            Refuse,
        ),
        // What follows an empty body is a request of the client's own.
        raw(
            "zero_then_pipelined",
            cat(&[
                b"POST {P} HTTP/1.1\r\nHost: x\r\n{K}Content-Length: 0\r\n\r\n",
                &d,
            ]),
            vec![post(Valid(Vec::new())), get("/smuggled"), get("/after")],
        ),
    ]
}

fn chunk_family() -> Vec<Mutation> {
    use Reading::*;
    let d = d();
    let x = format!("{:x}", d.len());
    let body = |size_line: &str, tail: &str| cat(&[size_line.as_bytes(), &d, tail.as_bytes()]);
    let c = |name: &str, b: Vec<u8>, reading: Reading| {
        m(name, "Transfer-Encoding: chunked\r\n", &b, reading)
    };
    let letters = b"abcdefghijklmnopqrstuvwxyz".to_vec();
    vec![
        c(
            "size_ffff_16",
            body("FFFFFFFFFFFFFFFF\r\n", "\r\n0\r\n\r\n"),
            Refuse,
        ),
        c(
            "size_wraps_to_zero",
            cat(&[
                b"10000000000000000\r\n\r\n",
                SMUGGLED.as_bytes(),
                b"0\r\n\r\n",
            ]),
            Refuse,
        ),
        c(
            "size_wraps_to_length",
            body(&format!("1000000000000000{x:0>2}\r\n"), "\r\n0\r\n\r\n"),
            Refuse,
        ),
        c(
            "leading_zeros",
            body(&format!("000{x}\r\n"), "\r\n0\r\n\r\n"),
            Valid(d.clone()),
        ),
        c(
            "hex_prefix",
            body(&format!("0x{x}\r\n"), "\r\n0\r\n\r\n"),
            Refuse,
        ),
        c("minus", body(&format!("-{x}\r\n"), "\r\n0\r\n\r\n"), Refuse),
        c("plus", body(&format!("+{x}\r\n"), "\r\n0\r\n\r\n"), Refuse),
        c(
            "space_before_size",
            body(&format!(" {x}\r\n"), "\r\n0\r\n\r\n"),
            Refuse,
        ),
        c(
            "space_after_size",
            body(&format!("{x} \r\n"), "\r\n0\r\n\r\n"),
            Either(d.clone()),
        ),
        c(
            "hex_lower",
            cat(&[b"1a\r\n", &letters, b"\r\n0\r\n\r\n"]),
            Valid(letters.clone()),
        ),
        c(
            "hex_upper",
            cat(&[b"1A\r\n", &letters, b"\r\n0\r\n\r\n"]),
            Valid(letters.clone()),
        ),
        c(
            "size_too_small",
            body(&format!("{:x}\r\n", d.len() - 5), "\r\n0\r\n\r\n"),
            Refuse,
        ),
        c(
            "size_too_large",
            body(&format!("{:x}\r\n", d.len() + 5), "\r\n0\r\n\r\n"),
            Refuse,
        ),
        c(
            "no_crlf_after_data",
            body(&format!("{x}\r\n"), "XX0\r\n\r\n"),
            Refuse,
        ),
        c(
            "extension",
            body(&format!("{x};name=value\r\n"), "\r\n0\r\n\r\n"),
            Valid(d.clone()),
        ),
        c(
            "extension_quoted",
            body(&format!("{x};n=\"v;\\\"q\\\"\"\r\n"), "\r\n0\r\n\r\n"),
            Valid(d.clone()),
        ),
        c(
            "extension_bws",
            body(&format!("{x} ; n = v\r\n"), "\r\n0\r\n\r\n"),
            Either(d.clone()),
        ),
        c(
            "extension_empty",
            body(&format!("{x};\r\n"), "\r\n0\r\n\r\n"),
            Either(d.clone()),
        ),
        c(
            "extension_long",
            body(&format!("{x};{}\r\n", "a".repeat(8192)), "\r\n0\r\n\r\n"),
            Either(d.clone()),
        ),
        c(
            "extension_on_last",
            body(&format!("{x}\r\n"), "\r\n0;last=1\r\n\r\n"),
            Valid(d.clone()),
        ),
        c(
            "trailer",
            body(&format!("{x}\r\n"), "\r\n0\r\nX-T: 1\r\n\r\n"),
            Valid(d.clone()),
        ),
        c(
            "trailer_content_length",
            body(&format!("{x}\r\n"), "\r\n0\r\nContent-Length: 999\r\n\r\n"),
            Either(d.clone()),
        ),
        c(
            "trailer_te",
            body(
                &format!("{x}\r\n"),
                "\r\n0\r\nTransfer-Encoding: chunked\r\n\r\n",
            ),
            Either(d.clone()),
        ),
        c(
            "two_chunks",
            cat(&[
                b"3\r\nGET\r\n",
                format!("{:x}\r\n", d.len() - 3).as_bytes(),
                &d[3..],
                b"\r\n0\r\n\r\n",
            ]),
            Valid(d.clone()),
        ),
        c(
            "last_chunk_then_field_line_request",
            cat(&[b"0\r\n", SMUGGLED.as_bytes()]),
            Any,
        ),
    ]
}

fn line_family() -> Vec<Mutation> {
    use Reading::*;
    let (d, t) = (d(), chunked(&d()));
    let l = d.len();
    let lf = |s: &str| s.replace("\r\n", "\n");
    vec![
        raw(
            "bare_lf_everywhere",
            cat(&[lf(&format!("POST {{P}} HTTP/1.1\r\nHost: x\r\n{{K}}Content-Length: {l}\r\n\r\n")).as_bytes(), &d]),
            vec![post(Either(d.clone())), get("/after")],
        ),
        raw(
            "bare_lf_request_line",
            cat(&[format!("POST {{P}} HTTP/1.1\nHost: x\r\n{{K}}Content-Length: {l}\r\n\r\n").as_bytes(), &d]),
            vec![post(Either(d.clone())), get("/after")],
        ),
        m("bare_lf_one_field", &format!("X-A: a\nContent-Length: {l}\r\n"), &d, Either(d.clone())),
        m("bare_lf_ends_head", &format!("Content-Length: {l}\r\n\n"), &d, Any).no_terminator(),
        m("bare_lf_then_te", &format!("X-A: a\nTransfer-Encoding: chunked\r\nContent-Length: {}\r\n", t.len()), &t, Any),
        m("bare_cr_in_value", &format!("X-A: a\rb\r\nContent-Length: {l}\r\n"), &d, Either(d.clone())),
        m("bare_cr_then_te", &format!("X-A: a\rTransfer-Encoding: chunked\r\nContent-Length: {}\r\n", t.len()), &t, Either(t.clone())),
        m("bare_cr_line_end", &format!("X-A: a\rContent-Length: {l}\r\n"), &d, Any),
        m("chunk_size_bare_lf", "Transfer-Encoding: chunked\r\n", &cat(&[format!("{l:x}\n").as_bytes(), &d, b"\r\n0\r\n\r\n"]), Either(d.clone())),
        m("chunk_data_bare_lf", "Transfer-Encoding: chunked\r\n", &cat(&[format!("{l:x}\r\n").as_bytes(), &d, b"\n0\r\n\r\n"]), Either(d.clone())),
        m("last_chunk_bare_lf", "Transfer-Encoding: chunked\r\n", &cat(&[format!("{l:x}\r\n").as_bytes(), &d, b"\r\n0\n\n"]), Either(d.clone())),
        m("chunk_size_bare_cr", "Transfer-Encoding: chunked\r\n", &cat(&[format!("{l:x}\r").as_bytes(), &d, b"\r\n0\r\n\r\n"]), Refuse),
        m("chunk_extension_bare_cr", "Transfer-Encoding: chunked\r\n", &cat(&[format!("{l:x};a\rb\r\n").as_bytes(), &d, b"\r\n0\r\n\r\n"]), Either(d.clone())),
        m("fold_custom", &format!("X-A: a\r\n b\r\nContent-Length: {l}\r\n"), &d, Either(d.clone())),
        m("fold_tab", &format!("X-A: a\r\n\tb\r\nContent-Length: {l}\r\n"), &d, Either(d.clone())),
        m("fold_te_with_cl", &format!("Transfer-Encoding:\r\n chunked\r\nContent-Length: {}\r\n", t.len()), &t, ThenClose(Some(d.clone()))),
        m("fold_cl", &format!("Content-Length:\r\n {l}\r\n"), &d, Either(d.clone())),
        raw(
            "fold_first_line_te",
            cat(&[format!("POST {{P}} HTTP/1.1\r\n Transfer-Encoding: chunked\r\nHost: x\r\n{{K}}Content-Length: {}\r\n\r\n", t.len()).as_bytes(), &t]),
            vec![post(Either(t.clone())), get("/after")],
        ),
    ]
}

fn byte_and_name_family() -> Vec<Mutation> {
    use Reading::*;
    let (d, t) = (d(), chunked(&d()));
    let l = d.len();
    let tl = t.len();
    let f = |name: &str, field: &str, reading: Reading| {
        m(
            name,
            &format!("{field}\r\nContent-Length: {l}\r\n"),
            &d,
            reading,
        )
    };
    vec![
        f("nul_in_value", "X-A: a\0b", Either(d.clone())),
        f("del_in_value", "X-A: a\x7fb", Either(d.clone())),
        f("vt_in_value", "X-A: a\x0bb", Either(d.clone())),
        f("esc_in_value", "X-A: a\x1bb", Either(d.clone())),
        f("obs_text_in_value", "X-A: caf\u{e9}", Valid(d.clone())),
        m(
            "nul_after_te_with_cl",
            &format!("Transfer-Encoding: chunked\0\r\nContent-Length: {tl}\r\n"),
            &t,
            Any,
        ),
        m(
            "nul_after_cl",
            &format!("Content-Length: {l}\0\r\n"),
            &d,
            Any,
        ),
        f("nul_in_name", "X-\0A: b", Refuse),
        m(
            "space_before_colon_cl",
            &format!("Content-Length : {l}\r\n"),
            &d,
            Refuse,
        ),
        m(
            "space_before_colon_te",
            &format!("Transfer-Encoding : chunked\r\nContent-Length: {tl}\r\n"),
            &t,
            Refuse,
        ),
        m(
            "tab_before_colon_te",
            &format!("Transfer-Encoding\t: chunked\r\nContent-Length: {tl}\r\n"),
            &t,
            Refuse,
        ),
        f("space_in_name", "X A: b", Refuse),
        f("empty_name", ": b", Refuse),
        f("no_colon", "X-A b", Refuse),
        f("at_in_name", "X@A: b", Either(d.clone())),
        f("bracket_in_name", "X[A]: b", Either(d.clone())),
        f("non_ascii_name", "X-Caf\u{e9}: b", Either(d.clone())),
        f(
            "underscore_content_length",
            "Content_Length: 999",
            Valid(d.clone()),
        ),
        raw(
            "nul_in_target",
            cat(&[
                format!("POST {{P}}\0x HTTP/1.1\r\nHost: x\r\n{{K}}Content-Length: {l}\r\n\r\n")
                    .as_bytes(),
                &d,
            ]),
            vec![post(Refuse), get("/after")],
        ),
    ]
}

fn pipelining_family() -> Vec<Mutation> {
    use Reading::*;
    let d = d();
    let l = d.len();
    let keyed = format!("POST {{P}} HTTP/1.1\r\nHost: x\r\n{{K}}Content-Length: {l}\r\n\r\n");
    let keyed_chunked =
        "POST {P} HTTP/1.1\r\nHost: x\r\n{K}Transfer-Encoding: chunked\r\n\r\n".to_owned();
    let t = chunked(&d);
    let replay = |name: &str, first: Vec<u8>, second: Vec<u8>| Mutation {
        keyed_only: true,
        ..raw(
            name,
            cat(&[&first, &second]),
            vec![post(Valid(d.clone())), post(ReplayOf(0)), get("/after")],
        )
    };
    let expect = |name: &str, version: &str, fields: &str, body: &[u8]| {
        raw(
            name,
            cat(&[
                format!(
                    "POST {{P}} {version}\r\nHost: x\r\n{{K}}Expect: 100-continue\r\n{fields}\r\n"
                )
                .as_bytes(),
                body,
            ]),
            vec![post(Valid(d.clone())), get("/after")],
        )
    };
    vec![
        replay("replay_then_passthrough", cat(&[keyed.as_bytes(), &d]), cat(&[keyed.as_bytes(), &d])),
        replay("chunked_replay_then_passthrough", cat(&[keyed_chunked.as_bytes(), &t]), cat(&[keyed_chunked.as_bytes(), &t])),
        replay("length_then_chunked_replay", cat(&[keyed.as_bytes(), &d]), cat(&[keyed_chunked.as_bytes(), &t])),
        raw(
            "three_in_one_write",
            cat(&[keyed.as_bytes(), &d, format!("POST /second HTTP/1.1\r\nHost: x\r\nContent-Length: {l}\r\n\r\n").as_bytes(), &d]),
            vec![post(Valid(d.clone())), Want { method: "POST", path: "/second", reading: Valid(d.clone()) }, get("/after")],
        ),
        expect("expect_with_length", "HTTP/1.1", &format!("Content-Length: {l}\r\n"), &d),
        expect("expect_chunked", "HTTP/1.1", "Transfer-Encoding: chunked\r\n", &t),
        expect("expect_http10", "HTTP/1.0", &format!("Content-Length: {l}\r\n"), &d),
        raw(
            "expect_upper",
            cat(&[format!("POST {{P}} HTTP/1.1\r\nHost: x\r\n{{K}}Expect: 100-Continue\r\nContent-Length: {l}\r\n\r\n").as_bytes(), &d]),
            vec![post(Valid(d.clone())), get("/after")],
        ),
    ]
}

impl Mutation {
    /// The request line says HTTP/1.0 (with `Connection: keep-alive`, so a server may
    /// go on to `/after`).
    fn http10(mut self) -> Self {
        self.bytes = replace(
            &self.bytes,
            b" HTTP/1.1\r\nHost: x\r\n{K}",
            b" HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n{K}",
        );
        self
    }

    /// The head's empty line is the fields' own (a case that ends its head itself).
    fn no_terminator(mut self) -> Self {
        let at = wire::find(&self.bytes, b"\r\n\n\r\n").unwrap();
        self.bytes.drain(at + 3..at + 5);
        self
    }
}

fn replace(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = hay;
    while let Some(i) = wire::find(rest, from) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(to);
        rest = &rest[i + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lane {
    Keyed,
    Pass,
}

/// One case made concrete: a mutation on a lane, whole bytes.
struct Concrete {
    label: String,
    bytes: Vec<u8>,
    wants: Vec<(String, Want)>,
    split: usize,
}

fn concrete(m: &Mutation, lane: Lane) -> Concrete {
    let (path, key) = match lane {
        Lane::Keyed => (KEYED_PATH, "Idempotency-Key: k-1\r\n"),
        Lane::Pass => (PASS_PATH, ""),
    };
    let bytes = replace(
        &replace(&m.bytes, b"{P}", path.as_bytes()),
        b"{K}",
        key.as_bytes(),
    );
    let wants = m
        .wants
        .iter()
        .map(|w| (w.path.replace("{P}", path), w.clone()))
        .collect();
    Concrete {
        label: format!(
            "{} @{}",
            m.name,
            if lane == Lane::Keyed { "keyed" } else { "pass" }
        ),
        split: m.split_at.unwrap_or_else(|| head_end(&bytes)),
        bytes,
        wants,
    }
}

/// What one proxy did with one case: its verdict for the table, and what went wrong.
struct Judged {
    verdict: String,
    failures: Vec<String>,
    notes: Vec<String>,
}

/// Runs `c` against `proxy` (in front of `rec`) and judges it.
async fn run_request_case(
    c: &Concrete,
    proxy: SocketAddr,
    rec: &Recorder,
    split: bool,
    replays: bool,
) -> Judged {
    let methods: Vec<&str> = c.wants.iter().map(|(_, w)| w.method).collect();
    let parts = if split {
        vec![c.bytes[..c.split].to_vec(), c.bytes[c.split..].to_vec()]
    } else {
        vec![c.bytes.clone()]
    };
    let ex = exchange(proxy, &parts, Duration::from_millis(50), &methods).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let seen = rec.seen.lock().unwrap().clone();
    let unreadable = rec.unreadable.lock().unwrap().clone();
    judge_requests(c, &ex, &seen, &unreadable, replays)
}

fn judge_requests(
    c: &Concrete,
    ex: &Exchange,
    seen: &[WireRequest],
    unreadable: &[String],
    replays: bool,
) -> Judged {
    let mut fail = Vec::new();
    let mut notes = Vec::new();
    for u in unreadable {
        // A streamed body the gateway gave up on ends its upstream request unfinished:
        // nothing was executed. Anything else unreadable is a fault of what it forwarded.
        match u.starts_with(UNFINISHED) {
            true => notes.push("leaves an upstream request unfinished".into()),
            false => fail.push(format!("the upstream could not read what it was sent: {u}")),
        }
    }
    let sent_paths: BTreeSet<&str> = c.wants.iter().map(|(p, _)| p.as_str()).collect();
    for (i, r) in seen.iter().enumerate() {
        if !sent_paths.contains(r.target.as_str()) {
            fail.push(format!(
                "DESYNC: the upstream saw `{} {}` (request {i}), which the client never sent as a request",
                r.method, r.target
            ));
        }
        for f in &r.faults {
            fail.push(format!(
                "forwarded an ambiguous head ({f}): {:?}",
                wire::show(&r.head)
            ));
        }
        for (name, value) in &r.fields {
            if name.contains('_') {
                notes.push(format!("forwards `{name}`"));
            }
            if name == "content-length" && value.len() > 1 && value.starts_with(b"0") {
                notes.push(format!("forwards Content-Length {:?}", wire::show(value)));
            }
            if name == "expect" {
                notes.push("forwards Expect".into());
            }
            if value.contains(&0x7f) {
                notes.push(format!("forwards DEL in `{name}`"));
            }
        }
    }
    if let StreamEnd::Malformed(why, bytes) = &ex.end {
        fail.push(format!(
            "the client cannot read its answers: {why}: {:?}",
            wire::show(bytes)
        ));
    }
    let mut used = BTreeSet::new();
    let mut refused_at = None;
    let mut verdict = String::new();
    for (i, a) in ex.answers.iter().enumerate() {
        let Some((path, want)) = c.wants.get(i) else {
            fail.push(format!("an answer too many ({} {:?})", a.status, a.text()));
            continue;
        };
        if let Some(at) = refused_at {
            fail.push(format!(
                "answer {i} ({} {:?}) after the refusal of request {at}",
                a.status,
                a.text()
            ));
        }
        let upstream_id = a.value("x-seen").and_then(|v| v.parse::<usize>().ok());
        if i == 0 {
            verdict = match upstream_id {
                Some(_) => "accepted".into(),
                None => format!("refused {}", a.status),
            };
        }
        match upstream_id {
            None => {
                if a.status >= 400 {
                    refused_at = Some(i);
                    if let Reading::Valid(_) = want.reading {
                        notes.push(format!("refuses a valid request with {}", a.status));
                    }
                } else {
                    notes.push(format!("answer {i}: {} not from the upstream", a.status));
                }
            }
            Some(id) => {
                let Some(r) = seen.get(id) else {
                    fail.push(format!(
                        "answer {i} names upstream request {id}, which the upstream never saw"
                    ));
                    continue;
                };
                if let Reading::ReplayOf(j) = want.reading {
                    if replays {
                        let first = ex.answers.get(j).and_then(|a| a.value("x-seen"));
                        if first.as_deref() != Some(&id.to_string()) {
                            fail.push(format!(
                                "answer {i} is not a replay of answer {j}: upstream request {id}"
                            ));
                        }
                        continue;
                    }
                }
                if !used.insert(id) {
                    fail.push(format!("answer {i} repeats upstream request {id}'s answer"));
                }
                if r.method != want.method || r.target != *path {
                    fail.push(format!(
                        "DESYNC: answer {i} (to `{} {path}`) is the upstream's answer to `{} {}`",
                        want.method, r.method, r.target
                    ));
                }
                let framed = match &want.reading {
                    Reading::Valid(b) | Reading::Either(b) | Reading::ThenClose(Some(b)) => Some(b),
                    _ => None,
                };
                if let Some(b) = framed {
                    if r.body != *b {
                        fail.push(format!(
                            "request {i}'s body reached the upstream as {:?}, RFC 9112 frames {:?}",
                            wire::show(&r.body),
                            wire::show(b)
                        ));
                    }
                }
                if let Reading::Refuse = want.reading {
                    notes.push(format!("accepts request {i} (RFC: invalid)"));
                }
                if let Reading::ThenClose(_) = want.reading {
                    if ex.answers.len() > i + 1 {
                        fail.push(format!(
                            "request {i} has Transfer-Encoding beside Content-Length or in HTTP/1.0: the connection must close after its answer (RFC 9112 §6.1, §6.3), yet `{}` was answered",
                            c.wants[i + 1].0
                        ));
                    }
                }
            }
        }
    }
    if verdict.is_empty() {
        verdict = if ex.closed {
            "closed, no answer".into()
        } else {
            "no answer".into()
        };
    }
    if ex.answers.len() < c.wants.len() && refused_at.is_none() && !verdict.starts_with("closed") {
        verdict.push_str(&format!(
            " ({}/{} answered)",
            ex.answers.len(),
            c.wants.len()
        ));
    }
    for (id, r) in seen.iter().enumerate() {
        if !used.contains(&id) {
            fail.push(format!(
                "the upstream executed `{} {}` (request {id}) but no answer to it reached the client",
                r.method, r.target
            ));
        }
    }
    if refused_at.is_some() && !ex.closed {
        fail.push("the connection stayed open after a refusal".into());
    }
    notes.sort();
    notes.dedup();
    Judged {
        verdict,
        failures: fail,
        notes,
    }
}

/// Runs a family of request mutations on the gateway (keyed and passthrough, one segment
/// and split) and on nginx; prints where they differ; fails once, naming every failure.
async fn request_family(family: &str, mutations: Vec<Mutation>) {
    let started = Instant::now();
    let mut cases = Vec::new();
    for m in &mutations {
        cases.push(concrete(m, Lane::Keyed));
        if !m.keyed_only {
            cases.push(concrete(m, Lane::Pass));
        }
    }
    let cases = Arc::new(cases);
    // Each run: its own upstream; the gateway's own gateway, nginx's shared process.
    let mut nginx_ups = Vec::new();
    for _ in cases.iter() {
        nginx_ups.push(recording_upstream().await);
    }
    let nginx = Nginx::start(&nginx_ups.iter().map(|(a, _)| *a).collect::<Vec<_>>());
    let limit = Arc::new(tokio::sync::Semaphore::new(24));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..cases.len() {
        for split in [false, true] {
            let (cases, limit) = (cases.clone(), limit.clone());
            tasks.spawn(async move {
                let _permit = limit.acquire().await.unwrap();
                let (up, rec) = recording_upstream().await;
                let gw = gateway(up, "5s").await;
                let j = run_request_case(&cases[i], gw.addr, &rec, split, true).await;
                (i, if split { "gateway split" } else { "gateway" }, j)
            });
        }
        if let Some(n) = &nginx {
            let (cases, limit) = (cases.clone(), limit.clone());
            let (addr, rec) = (n.addrs[i], nginx_ups[i].1.clone());
            tasks.spawn(async move {
                let _permit = limit.acquire().await.unwrap();
                (
                    i,
                    "nginx",
                    run_request_case(&cases[i], addr, &rec, false, false).await,
                )
            });
        }
    }
    let mut results: Vec<Vec<(&str, Judged)>> = (0..cases.len()).map(|_| Vec::new()).collect();
    while let Some(r) = tasks.join_next().await {
        let (i, who, j) = r.unwrap();
        results[i].push((who, j));
    }
    drop(nginx);
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for (c, rs) in cases.iter().zip(&results) {
        let get = |who: &str| rs.iter().find(|(w, _)| *w == who).map(|(_, j)| j);
        let (gw, split) = (get("gateway").unwrap(), get("gateway split").unwrap());
        if let Some(ng) = get("nginx") {
            let accepted = |j: &Judged| j.verdict.starts_with("accepted");
            if accepted(gw) != accepted(ng) || accepted(split) != accepted(ng) {
                let mut notes = gw.notes.clone();
                notes.extend(ng.failures.iter().map(|f| format!("nginx: {f}")));
                table.push(format!(
                    "| {:<44} | {:<22} | {:<22} | {:<22} | {}",
                    c.label,
                    gw.verdict,
                    split.verdict,
                    ng.verdict,
                    notes.join("; ")
                ));
            }
        }
        for (who, j) in rs {
            if *who == "nginx" {
                continue;
            }
            for f in &j.failures {
                failures.push(format!("{family}/{} [{who}]: {f}", c.label));
            }
            if !j.notes.is_empty() && *who == "gateway" {
                println!("note {family}/{}: {}", c.label, j.notes.join("; "));
            }
        }
    }
    println!(
        "\n{family}: {} cases ({} mutations), gateway and nginx differ on {} (accepted or refused):",
        cases.len(),
        mutations.len(),
        table.len()
    );
    if !table.is_empty() {
        println!(
            "| {:<44} | {:<22} | {:<22} | {:<22} | notes",
            "case", "gateway", "gateway split", "nginx"
        );
        for row in &table {
            println!("{row}");
        }
    }
    println!("{family}: {:.1?}", started.elapsed());
    assert!(
        failures.is_empty(),
        "{} failure(s) in {family}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_with_both_lengths_and_te_obfuscations() {
    let mut all = cl_te_family();
    all.extend(te_family());
    request_family("cl_te", all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_with_odd_lengths_and_chunks() {
    let mut all = length_family();
    all.extend(chunk_family());
    request_family("lengths", all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_with_odd_lines_bytes_and_names() {
    let mut all = line_family();
    all.extend(byte_and_name_family());
    request_family("lines", all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_replays_and_expect() {
    request_family("pipelining", pipelining_family()).await;
}

// ---------------------------------------------------------------------------------------
// Response side: hostile upstream answers.

/// A smuggled answer, hidden where a stale length would expose it.
const INJECTED: &str = "HTTP/1.1 418 INJECTED\r\nContent-Length: 0\r\n\r\n";

/// One hostile answer, and what a client may read for it.
#[derive(Clone)]
struct Hostile {
    name: &'static str,
    answer: Vec<u8>,
    /// The upstream closes its connection after writing it.
    close: bool,
    /// The request it answers is `HEAD /pass` (else POSTs, keyed and passthrough).
    head: bool,
    /// The answer relayed whole: status and body. `None`: only a refusal is right.
    relay: Option<(u16, Vec<u8>)>,
    /// The answer may break off (the connection ends inside it).
    may_break: bool,
}

fn h(name: &'static str, answer: impl AsRef<[u8]>, relay: Option<(u16, &[u8])>) -> Hostile {
    Hostile {
        name,
        answer: answer.as_ref().to_vec(),
        close: false,
        head: false,
        relay: relay.map(|(s, b)| (s, b.to_vec())),
        may_break: false,
    }
}

impl Hostile {
    fn closes(mut self) -> Self {
        self.close = true;
        self
    }
    fn breaks(mut self) -> Self {
        self.may_break = true;
        self
    }
    fn answering_head(mut self) -> Self {
        self.head = true;
        self
    }
}

fn hostile_lengths() -> Vec<Hostile> {
    let data = format!("SAFE{INJECTED}");
    let d = data.as_bytes();
    let ch = String::from_utf8(chunked(d)).unwrap();
    let ok = "HTTP/1.1 200 OK\r\n";
    vec![
        h(
            "cl_then_te_injected",
            format!("{ok}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n{ch}"),
            Some((200, d)),
        ),
        h(
            "te_then_cl_injected",
            format!("{ok}Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n{ch}"),
            Some((200, d)),
        ),
        h(
            "cl_larger_than_chunked",
            format!("{ok}Content-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n{ch}"),
            Some((200, d)),
        ),
        h(
            "two_lengths",
            format!(
                "{ok}Content-Length: 4\r\nContent-Length: {}\r\n\r\n{data}",
                d.len()
            ),
            None,
        ),
        h(
            "two_lengths_comma",
            format!("{ok}Content-Length: 4, {}\r\n\r\n{data}", d.len()),
            None,
        ),
        h(
            "length_4_4",
            format!("{ok}Content-Length: 4, 4\r\n\r\nSAFE"),
            Some((200, b"SAFE")),
        ),
        h(
            "length_twice_same",
            format!("{ok}Content-Length: 4\r\nContent-Length: 4\r\n\r\nSAFE"),
            Some((200, b"SAFE")),
        ),
        h(
            "length_smaller_than_body",
            format!("{ok}Content-Length: 4\r\n\r\n{data}"),
            Some((200, b"SAFE")),
        ),
        h(
            "length_larger_then_close",
            format!("{ok}Content-Length: 10\r\n\r\nSAFE"),
            None,
        )
        .closes()
        .breaks(),
        h(
            "length_larger_stalls",
            format!("{ok}Content-Length: 10\r\n\r\nSAFE"),
            None,
        )
        .breaks(),
        h(
            "length_plus",
            format!("{ok}Content-Length: +4\r\n\r\nSAFE"),
            None,
        ),
        h(
            "length_zero_padded",
            format!("{ok}Content-Length: 0004\r\n\r\nSAFE"),
            Some((200, b"SAFE")),
        ),
        h(
            "chunked_then_bytes",
            format!("{ok}Transfer-Encoding: chunked\r\n\r\n4\r\nSAFE\r\n0\r\n\r\n{INJECTED}"),
            Some((200, b"SAFE")),
        ),
        h(
            "te_leading_space",
            format!("{ok}Transfer-Encoding:  chunked\r\n\r\n4\r\nSAFE\r\n0\r\n\r\n"),
            Some((200, b"SAFE")),
        ),
        h(
            "te_upper",
            format!("{ok}Transfer-Encoding: CHUNKED\r\n\r\n4\r\nSAFE\r\n0\r\n\r\n"),
            Some((200, b"SAFE")),
        ),
        h(
            "te_chunked_identity",
            format!("{ok}Transfer-Encoding: chunked, identity\r\n\r\n4\r\nSAFE\r\n0\r\n\r\n"),
            Some((200, b"4\r\nSAFE\r\n0\r\n\r\n")),
        )
        .closes(),
        h(
            "chunk_extension_and_trailer",
            format!("{ok}Transfer-Encoding: chunked\r\n\r\n4;a=b\r\nSAFE\r\n0\r\nX-T: 1\r\n\r\n"),
            Some((200, b"SAFE")),
        ),
        h(
            "chunk_size_overflow",
            format!("{ok}Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFF\r\nSAFE"),
            None,
        )
        .closes()
        .breaks(),
        h(
            "chunk_size_wrong",
            format!("{ok}Transfer-Encoding: chunked\r\n\r\n2\r\nSAFE\r\n0\r\n\r\n"),
            None,
        )
        .breaks(),
    ]
}

fn hostile_interim_and_bodiless() -> Vec<Hostile> {
    let ok4 = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nSAFE";
    vec![
        h(
            "continue_then_200",
            format!("HTTP/1.1 100 Continue\r\n\r\n{ok4}"),
            Some((200, b"SAFE")),
        ),
        h(
            "early_hints_then_200",
            format!("HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n{ok4}"),
            Some((200, b"SAFE")),
        ),
        h(
            "twenty_continues",
            format!("{}{ok4}", "HTTP/1.1 100 Continue\r\n\r\n".repeat(20)),
            Some((200, b"SAFE")),
        ),
        h(
            "continue_with_a_body",
            format!("HTTP/1.1 100 Continue\r\nContent-Length: 4\r\n\r\nSAFE{ok4}"),
            None,
        ),
        h(
            "no_content_with_length",
            "HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\nSAFE",
            Some((204, b"")),
        ),
        h(
            "no_content_then_injected",
            format!("HTTP/1.1 204 No Content\r\n\r\n{INJECTED}"),
            Some((204, b"")),
        ),
        h(
            "no_content_chunked",
            "HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nSAFE\r\n0\r\n\r\n",
            Some((204, b"")),
        ),
        h(
            "not_modified_with_body",
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 4\r\n\r\nSAFE",
            Some((304, b"")),
        ),
        h(
            "not_modified_then_injected",
            format!("HTTP/1.1 304 Not Modified\r\n\r\n{INJECTED}"),
            Some((304, b"")),
        ),
        h(
            "head_with_length",
            "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n",
            Some((200, b"")),
        )
        .answering_head(),
        h(
            "head_with_a_body",
            "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nSAFE",
            Some((200, b"")),
        )
        .answering_head(),
        h(
            "head_then_injected",
            format!("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n{INJECTED}"),
            Some((200, b"")),
        )
        .answering_head(),
        h(
            "head_chunked",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            Some((200, b"")),
        )
        .answering_head(),
    ]
}

fn hostile_ends_and_heads() -> Vec<Hostile> {
    let data = format!("SAFE{INJECTED}");
    vec![
        h(
            "close_delimited",
            "HTTP/1.1 200 OK\r\n\r\nSAFE",
            Some((200, b"SAFE")),
        )
        .closes(),
        h(
            "close_delimited_injected",
            format!("HTTP/1.1 200 OK\r\n\r\n{data}"),
            Some((200, data.as_bytes())),
        )
        .closes(),
        h(
            "http10_close_delimited",
            "HTTP/1.0 200 OK\r\n\r\nSAFE",
            Some((200, b"SAFE")),
        )
        .closes(),
        h(
            "http10_keep_alive",
            "HTTP/1.0 200 OK\r\nContent-Length: 4\r\nConnection: keep-alive\r\n\r\nSAFE",
            Some((200, b"SAFE")),
        ),
        h(
            "truncated_chunked",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\nSAFE",
            None,
        )
        .closes()
        .breaks(),
        h("truncated_head", "HTTP/1.1 200 OK\r\nContent-Le", None).closes(),
        h(
            "oversized_head",
            format!(
                "HTTP/1.1 200 OK\r\nX-Big: {}\r\nContent-Length: 4\r\n\r\nSAFE",
                "a".repeat(200_000)
            ),
            Some((200, b"SAFE")),
        ),
        h(
            "many_fields",
            format!(
                "HTTP/1.1 200 OK\r\n{}Content-Length: 4\r\n\r\nSAFE",
                "X-N: v\r\n".repeat(2000)
            ),
            Some((200, b"SAFE")),
        ),
        h(
            "status_without_reason",
            "HTTP/1.1 200\r\nContent-Length: 4\r\n\r\nSAFE",
            Some((200, b"SAFE")),
        ),
        h(
            "bare_lf_head",
            "HTTP/1.1 200 OK\nContent-Length: 4\n\nSAFE",
            Some((200, b"SAFE")),
        )
        .closes(),
        h(
            "obs_fold",
            "HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 4\r\n\r\nSAFE",
            Some((200, b"SAFE")),
        ),
        h(
            "nul_in_value",
            "HTTP/1.1 200 OK\r\nX-A: a\0b\r\nContent-Length: 4\r\n\r\nSAFE",
            Some((200, b"SAFE")),
        ),
        h(
            "space_before_colon",
            "HTTP/1.1 200 OK\r\nContent-Length : 4\r\n\r\nSAFE",
            Some((200, b"SAFE")),
        )
        .closes(),
    ]
}

/// An upstream that answers `/other...` with `other:<target>` and everything else with
/// `answer`; it records each request's line.
async fn hostile_upstream(x: Hostile) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (x, seen) = (x.clone(), s2.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = vec![0u8; 16 * 1024];
                loop {
                    match wire::read_request(&buf) {
                        RequestStep::Done(req, used) => {
                            buf.drain(..used);
                            seen.lock()
                                .unwrap()
                                .push(format!("{} {}", req.method, req.target));
                            let (answer, close) = if req.target.starts_with("/other") {
                                let body = format!("other:{}", req.target);
                                (
                                    format!(
                                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                                        body.len()
                                    )
                                    .into_bytes(),
                                    false,
                                )
                            } else {
                                (x.answer.clone(), x.close)
                            };
                            if s.write_all(&answer).await.is_err() || close {
                                return;
                            }
                            continue;
                        }
                        RequestStep::More { .. } => {}
                        RequestStep::Bad(_) => return,
                    }
                    match s.read(&mut chunk).await {
                        Ok(n @ 1..) => buf.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// One client connection of a hostile case: the request, then `GET /other?c=<n>`.
struct Shot {
    label: String,
    method: &'static str,
    first: Vec<u8>,
    split: bool,
    other: String,
}

fn shots(x: &Hostile) -> Vec<Shot> {
    let body = "{\"a\":1}";
    let post = |path: &str, key: &str| {
        let key = if key.is_empty() {
            String::new()
        } else {
            format!("Idempotency-Key: {key}\r\n")
        };
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{key}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    let plan: Vec<(String, &'static str, Vec<u8>, bool)> = if x.head {
        vec![
            (
                "HEAD".into(),
                "HEAD",
                b"HEAD /pass HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
                false,
            ),
            (
                "HEAD again".into(),
                "HEAD",
                b"HEAD /pass HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
                false,
            ),
        ]
    } else {
        vec![
            ("winner".into(), "POST", post(KEYED_PATH, "w1"), false),
            ("replay".into(), "POST", post(KEYED_PATH, "w1"), false),
            (
                "replay, body in a 2nd segment".into(),
                "POST",
                post(KEYED_PATH, "w1"),
                true,
            ),
            (
                "winner, body in a 2nd segment".into(),
                "POST",
                post(KEYED_PATH, "w2"),
                true,
            ),
            (
                "replay of it, body in a 2nd segment".into(),
                "POST",
                post(KEYED_PATH, "w2"),
                true,
            ),
            ("replay of it".into(), "POST", post(KEYED_PATH, "w2"), false),
            ("passthrough".into(), "POST", post(PASS_PATH, ""), false),
            (
                "passthrough, body in a 2nd segment".into(),
                "POST",
                post(PASS_PATH, ""),
                true,
            ),
        ]
    };
    plan.into_iter()
        .enumerate()
        .map(|(n, (label, method, first, split))| Shot {
            label,
            method,
            first,
            split,
            other: format!("/other?c={n}"),
        })
        .collect()
}

/// Runs every shot of `x` against a gateway of its own; the failures, each naming the shot.
async fn run_hostile(x: Hostile) -> Vec<String> {
    let (up, seen) = hostile_upstream(x.clone()).await;
    let gw = gateway(up, "1s").await;
    let mut fail = Vec::new();
    let shots = shots(&x);
    for shot in &shots {
        let other = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", shot.other);
        let parts = if shot.split {
            let at = head_end(&shot.first);
            vec![
                shot.first[..at].to_vec(),
                [&shot.first[at..], other.as_bytes()].concat(),
            ]
        } else {
            vec![[shot.first.as_slice(), other.as_bytes()].concat()]
        };
        let ex = exchange(
            gw.addr,
            &parts,
            Duration::from_millis(50),
            &[shot.method, "GET"],
        )
        .await;
        for f in judge_hostile(&x, shot, &ex) {
            fail.push(format!("{} ({}): {f}", x.name, shot.label));
        }
    }
    // The upstream saw only requests the clients sent, each at most once per send.
    let seen = seen.lock().unwrap().clone();
    for s in &seen {
        let sent = shots.iter().filter(|sh| s.ends_with(&sh.other)).count()
            + shots
                .iter()
                .filter(|sh| {
                    s.starts_with(sh.method)
                        && s.ends_with(if sh.first.starts_with(b"POST /pass") {
                            PASS_PATH
                        } else if sh.method == "HEAD" {
                            "/pass"
                        } else {
                            KEYED_PATH
                        })
                })
                .count();
        let times = seen.iter().filter(|t| *t == s).count();
        if sent == 0 || times > sent {
            fail.push(format!(
                "{}: the upstream saw `{s}` {times} time(s); clients sent it {sent} time(s)",
                x.name
            ));
        }
    }
    fail.sort();
    fail.dedup();
    fail
}

fn judge_hostile(x: &Hostile, shot: &Shot, ex: &Exchange) -> Vec<String> {
    let mut fail = Vec::new();
    if let StreamEnd::Malformed(why, bytes) = &ex.end {
        let at = bytes.len().min(300);
        fail.push(format!(
            "answer {} is malformed: {why}: {:?}",
            ex.answers.len(),
            wire::show(&bytes[..at])
        ));
    }
    let Some(first) = ex.answers.first() else {
        // Broken off, or still waiting on a stalled upstream.
        let broke = matches!(ex.end, StreamEnd::Incomplete(_));
        let nothing = ex.closed && ex.end == StreamEnd::Clean;
        if !(x.may_break && (broke || nothing)) && !matches!(ex.end, StreamEnd::Malformed(..)) {
            fail.push(format!(
                "no whole answer (closed: {}, left over: {:?})",
                ex.closed,
                match &ex.end {
                    StreamEnd::Incomplete(b) => wire::show(&b[..b.len().min(200)]),
                    _ => String::new(),
                }
            ));
        }
        return fail;
    };
    // A refusal, or the gateway's own answer about the key (in flight, not stored).
    let refused = first.status >= 500
        || first
            .value("content-type")
            .is_some_and(|t| t.starts_with("application/problem+json"));
    match (&x.relay, refused) {
        (_, true) => {}
        (Some((status, body)), false) => {
            if first.status != *status || first.body != *body {
                fail.push(format!(
                    "relayed {} {:?}; the upstream's answer is {status} {:?}",
                    first.status,
                    first.text(),
                    String::from_utf8_lossy(body)
                ));
            }
        }
        (None, false) => fail.push(format!(
            "relayed {} {:?}; only a refusal is right",
            first.status,
            first.text()
        )),
    }
    match ex.answers.get(1) {
        Some(second) => {
            let own = format!("other:{}", shot.other);
            if second.status != 200 || second.text() != own {
                fail.push(format!(
                    "the answer to `GET {}` is {} {:?}, not its own ({own:?}): bytes of another answer",
                    shot.other,
                    second.status,
                    second.text()
                ));
            }
        }
        None => {
            if !ex.closed {
                fail.push(format!(
                    "`GET {}` was never answered and the connection stayed open",
                    shot.other
                ));
            }
        }
    }
    for extra in ex.answers.iter().skip(2) {
        fail.push(format!(
            "an answer too many: {} {:?}",
            extra.status,
            extra.text()
        ));
    }
    fail
}

/// Runs a family of hostile answers concurrently; fails once, naming every failure.
async fn response_family(family: &str, hostiles: Vec<Hostile>) {
    let started = Instant::now();
    let n = hostiles.len();
    let mut tasks = tokio::task::JoinSet::new();
    for x in hostiles {
        tasks.spawn(run_hostile(x));
    }
    let mut failures = Vec::new();
    while let Some(r) = tasks.join_next().await {
        failures.extend(r.unwrap());
    }
    failures.sort();
    println!("{family}: {n} hostile answers, {:.1?}", started.elapsed());
    assert!(
        failures.is_empty(),
        "{} failure(s) in {family}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_answers_with_stale_or_odd_lengths() {
    response_family("response lengths", hostile_lengths()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_interim_and_bodiless_answers() {
    response_family(
        "response interim and bodiless",
        hostile_interim_and_bodiless(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_answer_ends_and_heads() {
    response_family("response ends and heads", hostile_ends_and_heads()).await;
}
