//! Request framing, request heads and response heads, against hyper's rules.

use super::*;
use http::header;

fn parts(method: &str, headers: &[(&'static str, &'static str)]) -> Parts {
    let mut req = http::Request::builder().method(method).uri("/a?b=c");
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    req.body(()).unwrap().into_parts().0
}

#[test]
fn a_request_is_framed_as_hyper_frames_it() {
    let mut p = parts("POST", &[]);
    assert_eq!(frame_request(&mut p, false, Some(5)), Send::Length(5));
    assert_eq!(p.headers[CONTENT_LENGTH], "5");
    let mut p = parts("POST", &[("content-length", "7")]);
    assert_eq!(frame_request(&mut p, false, None), Send::Length(7));
    let mut p = parts("POST", &[]);
    assert_eq!(frame_request(&mut p, false, None), Send::Chunked);
    assert_eq!(p.headers[TRANSFER_ENCODING], "chunked");
    let mut p = parts("GET", &[]);
    assert_eq!(frame_request(&mut p, false, None), Send::Length(0));
    assert!(p.headers.is_empty());
    let mut p = parts("POST", &[("transfer-encoding", "chunked")]);
    assert_eq!(frame_request(&mut p, true, Some(0)), Send::Length(0));
    assert!(
        p.headers.is_empty(),
        "an empty body sends no framing header"
    );
    let mut p = parts(
        "POST",
        &[("transfer-encoding", "gzip"), ("content-length", "3")],
    );
    assert_eq!(frame_request(&mut p, false, Some(3)), Send::Chunked);
    let te: Vec<_> = p.headers.get_all(TRANSFER_ENCODING).iter().collect();
    assert_eq!(te, ["gzip", "chunked"]);
    assert!(!p.headers.contains_key(CONTENT_LENGTH));
}

#[test]
fn a_request_head_is_origin_form_http_1_1() {
    let p = parts("PUT", &[("x-a", "1"), ("host", "up:81")]);
    assert_eq!(
        encode_request(&p),
        b"PUT /a?b=c HTTP/1.1\r\nx-a: 1\r\nhost: up:81\r\n\r\n"
    );
}

fn parse(head: &str, method: Method) -> Result<Parsed, WireError> {
    parse_response(&mut BytesMut::from(head), &method)
}

fn head(head: &str, method: Method) -> ResponseHead {
    let mut buf = BytesMut::from(format!("{head}body").as_str());
    match parse_response(&mut buf, &method) {
        Ok(Parsed::Final(h)) => {
            assert_eq!(&buf[..], b"body", "the head is taken, the body left");
            h
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_response_s_body_is_delimited_by_rfc_9112() {
    let h = head(
        "HTTP/1.1 201 Created\r\nContent-Length: 12\r\n\r\n",
        Method::POST,
    );
    assert_eq!(
        (h.status, h.framing, h.keep_alive),
        (StatusCode::CREATED, Framing::Length(12), true)
    );
    let h = head(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
        Method::GET,
    );
    assert_eq!(h.framing, Framing::Chunked);
    let h = head("HTTP/1.1 200 OK\r\n\r\n", Method::GET);
    assert_eq!((h.framing, h.keep_alive), (Framing::UntilClose, false));
    let h = head("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", Method::HEAD);
    assert_eq!(h.framing, Framing::Length(0));
    let h = head(
        "HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n",
        Method::GET,
    );
    assert_eq!(h.framing, Framing::Length(0));
    let h = head(
        "HTTP/1.1 200 OK\r\ncontent-length: 4, 4\r\nconnection: Close\r\n\r\n",
        Method::GET,
    );
    assert_eq!((h.framing, h.keep_alive), (Framing::Length(4), false));
    let h = head("HTTP/1.0 200 OK\r\ncontent-length: 4\r\n\r\n", Method::GET);
    assert_eq!((h.version, h.keep_alive), (Version::HTTP_10, false));
    let h = head(
        "HTTP/1.0 200 OK\r\ncontent-length: 4\r\nConnection: keep-alive\r\n\r\n",
        Method::GET,
    );
    assert!(h.keep_alive);
    for bad in [
        "HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncontent-length: 5\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: +4\r\n\r\n",
        "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        "HTTP/1.1 101 Switching Protocols\r\n\r\n",
        "HTTP/1.1 2000 OK\r\n\r\n",
        "HTTX/1.1 200 OK\r\n\r\n",
    ] {
        assert!(parse(bad, Method::GET).is_err(), "{bad}");
    }
}

/// The fields a head of `fields` keeps, by name, sorted.
fn kept(fields: &str) -> Vec<String> {
    let wire = format!("HTTP/1.1 200 OK\r\n{fields}content-length: 0\r\n\r\n");
    let Ok(Parsed::Final(head)) = parse_response(&mut BytesMut::from(&wire[..]), &Method::GET)
    else {
        panic!("{wire}")
    };
    let mut names: Vec<String> = head.headers.keys().map(|n| n.as_str().to_owned()).collect();
    names.sort();
    names
}

#[test]
fn a_response_s_hop_by_hop_fields_go_no_further() {
    let hops = "Connection: keep-alive\r\nKeep-Alive: timeout=5\r\nProxy-Connection: x\r\n\
        Proxy-Authenticate: Basic\r\nProxy-Authorization: x\r\nTE: trailers\r\n\
        Upgrade: h2c\r\nTrailer: x-sum\r\nX-Kept: 1\r\n";
    assert_eq!(kept(hops), ["content-length", "trailer", "x-kept"]);
    // What `Connection` names goes too, wherever it stands.
    let named =
        "X-Before: 1\r\nConnection: Keep-Alive, x-before , X-After\r\nX-After: 1\r\nX-Kept: 1\r\n";
    assert_eq!(kept(named), ["content-length", "x-kept"]);
    assert_eq!(
        kept("Connection: close\r\nClose: 1\r\nX-Kept: 1\r\n"),
        ["content-length", "x-kept"]
    );
    // Every hop-by-hop name is found whatever its case, and no other name of its length.
    let hops = crate::hops::HOP_BY_HOP.iter().chain([&header::UPGRADE]);
    for (i, name) in hops.enumerate() {
        let upper = name.as_str().to_ascii_uppercase();
        assert_eq!(crate::hops::hop_by_hop(upper.as_bytes()), Some(i), "{name}");
        let other = "x".repeat(name.as_str().len());
        assert!(
            crate::hops::hop_by_hop(other.as_bytes()).is_none(),
            "{name}"
        );
    }
    assert!(crate::hops::hop_by_hop(b"trailer").is_none());
}

#[test]
fn informational_and_partial_heads() {
    let mut buf = BytesMut::from("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200");
    assert!(matches!(
        parse_response(&mut buf, &Method::POST),
        Ok(Parsed::Interim)
    ));
    assert_eq!(&buf[..], b"HTTP/1.1 200");
    assert!(matches!(
        parse("HTTP/1.1 200 OK\r\ncontent-le", Method::POST),
        Ok(Parsed::Partial)
    ));
    let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: 1\r\n")).collect();
    let too_many = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
    assert!(matches!(
        parse(&too_many, Method::GET),
        Err(WireError::HeadTooLarge)
    ));
    let endless = format!("HTTP/1.1 200 OK\r\nx-big: {}", "a".repeat(MAX_HEAD));
    assert!(matches!(
        parse(&endless, Method::GET),
        Err(WireError::HeadTooLarge)
    ));
}
