//! A request head's checks before routing: the method, the `Host`, and the target in the
//! one form the upstream may see (origin form, normalised path).
//!
//! The upstream only ever learns the gateway's own authority: a client's absolute-form
//! target (`GET http://user:pw@internal:8443?y HTTP/1.1`, or an HTTP/2 `:path` of `?q=1`)
//! would otherwise ride to the upstream's request line, where RFC 9112 §3.2.2 lets it
//! override the `Host` the gateway sets.

use std::borrow::Cow;

use http::header::HOST;
use http::uri::{Authority, PathAndQuery};
use http::{HeaderValue, Method, Request, Uri, Version};

use crate::edge::problem::GatewayError;
use crate::protocol::path::{self, PathError};
use crate::protocol::route::{self, Route};

/// Refuses what no route and no upstream should see: `CONNECT` (a reverse proxy opens no
/// tunnels) and an HTTP/1 `Host` that RFC 9112 §3.2 says to answer 400: missing on
/// HTTP/1.1, repeated, or not an authority (`a.example/../x`).
pub(super) fn check<B>(req: &Request<B>) -> Result<(), GatewayError> {
    if req.method() == Method::CONNECT {
        return Err(GatewayError::MethodNotSupported);
    }
    let mut hosts = req.headers().get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(GatewayError::HostInvalid(
            "the request has more than one Host",
        ));
    }
    match host {
        None if req.version() == Version::HTTP_11 => Err(GatewayError::HostInvalid(
            "an HTTP/1.1 request must carry Host",
        )),
        None => Ok(()),
        Some(v) if host_is_valid(v) => Ok(()),
        Some(_) => Err(GatewayError::HostInvalid(
            "Host must be a host name or address with an optional port",
        )),
    }
}

/// `uri-host [":" port]`, no user information; empty is allowed (RFC 9110 §7.2: a target
/// without authority).
fn host_is_valid(v: &HeaderValue) -> bool {
    if v.is_empty() || is_plain_host(v.as_bytes()) {
        return true;
    }
    let Ok(s) = v.to_str() else {
        return false;
    };
    matches!(s.parse::<Authority>(), Ok(a) if a.as_str() == s && !s.contains('@') && !a.host().is_empty())
}

/// A name or IPv4 address of letters, digits, `.` and `-`, and a port of one to five
/// digits: what nearly every `Host` is, and valid as an authority without parsing one.
pub fn is_plain_host(v: &[u8]) -> bool {
    let (host, port) = match v.iter().position(|&b| b == b':') {
        Some(i) => (&v[..i], Some(&v[i + 1..])),
        None => (v, None),
    };
    !host.is_empty()
        && host
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
        && port.is_none_or(|p| (1..=5).contains(&p.len()) && p.iter().all(u8::is_ascii_digit))
}

/// Refuses a method whose upper-case spelling a route would dedupe (`post` on a `POST`
/// route): methods are case-sensitive, so `post` would pass through undeduped to an
/// upstream that may well treat it as the write it looks like.
pub(super) fn method_case(
    routes: &[Route],
    method: &Method,
    path: &str,
) -> Result<(), GatewayError> {
    let upper = method.as_str().to_ascii_uppercase();
    if upper == method.as_str() {
        return Ok(());
    }
    match Method::from_bytes(upper.as_bytes()) {
        Ok(m) if route::find(routes, &m, path).is_some() => Err(GatewayError::MethodCase),
        _ => Ok(()),
    }
}

/// The request with an origin-form target: its path normalised (query untouched), no
/// scheme or authority. An HTTP/2 request's `:authority` becomes its `Host` (without user
/// information) when it has none, as the `Host` of an HTTP/1 request.
pub(super) fn origin_form<B>(mut req: Request<B>) -> Result<Request<B>, PathError> {
    let uri = req.uri();
    let origin_already = uri.scheme().is_none() && uri.authority().is_none();
    let normal = path::normalise(uri.path())?;
    if origin_already && matches!(normal, Cow::Borrowed(_)) && uri.path_and_query().is_some() {
        return Ok(req);
    }
    let pq = match uri.query() {
        Some(q) => format!("{normal}?{q}"),
        None => normal.into_owned(),
    };
    if let Some(a) = uri.authority() {
        let host = match a.port() {
            Some(p) => format!("{}:{}", a.host(), p),
            None => a.host().to_owned(),
        };
        if let (false, Ok(v)) = (
            req.headers().contains_key(HOST),
            HeaderValue::from_str(&host),
        ) {
            req.headers_mut().insert(HOST, v);
        }
    }
    // A normalised valid path is still a valid path; should that ever fail, the request
    // is refused rather than forwarded unnormalised.
    let pq: PathAndQuery = pq.parse().map_err(|_| PathError::MalformedEscape)?;
    *req.uri_mut() = Uri::from(pq);
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_host_is_one_the_authority_parser_accepts() {
        let hosts = [
            "example.com",
            "example.com:443",
            "127.0.0.1:9710",
            "a",
            "a:0",
            "a-b.c:65535",
            "xn--caf-dma.example",
            "a:",
            ":80",
            "a:123456",
            "a:8o",
            "a b",
            "a@b",
            "u@a:1",
            "[::1]:80",
            "[::1]",
            "a:1:2",
            "a_b",
            "a/b",
            "a%41",
            "é",
            "a:+1",
            "",
        ];
        let mut plain = 0;
        for h in hosts {
            let slow = matches!(h.parse::<Authority>(), Ok(a) if a.as_str() == h
                && !h.contains('@') && !a.host().is_empty());
            if is_plain_host(h.as_bytes()) {
                plain += 1;
                assert!(slow, "{h}");
            }
            let v = HeaderValue::from_bytes(h.as_bytes()).unwrap();
            assert_eq!(host_is_valid(&v), slow || h.is_empty(), "{h}");
        }
        assert_eq!(plain, 7);
    }

    fn req(target: &str, host: Option<&str>) -> Request<()> {
        let mut b = Request::get(target);
        if let Some(h) = host {
            b = b.header(HOST, h);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn absolute_targets_become_origin_form() {
        let r = origin_form(req("http://user:pw@internal.local:8443?y", Some("gw"))).unwrap();
        assert_eq!(r.uri().to_string(), "/?y");
        assert_eq!(r.headers()[HOST], "gw");
        let r = origin_form(req("http://internal.local:8443/a/./b", None)).unwrap();
        assert_eq!(r.uri().to_string(), "/a/b");
        assert_eq!(r.headers()[HOST], "internal.local:8443");
        let r = origin_form(req("/a/b?q", None)).unwrap();
        assert_eq!(r.uri().to_string(), "/a/b?q");
    }

    #[test]
    fn host_rules() {
        assert!(check(&req("/", Some("a.example:8080"))).is_ok());
        assert!(check(&req("/", Some(""))).is_ok());
        assert!(check(&req("/", Some("[::1]:80"))).is_ok());
        assert!(check(&req("/", None)).is_err());
        assert!(check(&req("/", Some("a.example/../x"))).is_err());
        assert!(check(&req("/", Some("u@a.example"))).is_err());
        let mut two = req("/", Some("a"));
        two.headers_mut()
            .append(HOST, HeaderValue::from_static("b"));
        assert!(check(&two).is_err());
        let mut old = req("/", None);
        *old.version_mut() = Version::HTTP_10;
        assert!(check(&old).is_ok());
    }
}
