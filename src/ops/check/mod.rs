//! `check`: the configuration as the gateway reads it ([`summary`]), and with `--request`,
//! what the gateway would do with one request ([`explain`]), told step by step with the
//! same functions the request pipeline runs (path normalisation, route matching, a signed
//! route's signature check, the route's one verdict). The tool a user reaches for when a
//! duplicate got through. Pure: no I/O; a signature's age is told at the clock's current
//! time, as the gateway would check it.

use std::fmt::Write;
use std::time::SystemTime;

use http::{HeaderMap, Method};

use crate::config::{format_duration, Config};
use crate::edge::problem::GatewayError;
use crate::protocol::key::{KeyRule, MatchRule, RequestPart, RequestView};
use crate::protocol::path;
use crate::protocol::route::{self, Mode, Route, Skip, Verdict};

mod grpc;
mod store;
mod summary;

pub use self::store::{check_store, StoreVerdict};
pub use self::summary::summary;

/// A request described on the command line.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Method.
    pub method: Method,
    /// Request target: path and optional `?query`, as the client sends it.
    pub target: String,
    /// Headers given with `-H`.
    pub headers: HeaderMap,
    /// Body given with `--body`.
    pub body: Vec<u8>,
    /// Whether headers or a body were given: only then is the key derived.
    pub derive: bool,
}

/// The explanation, one fact per line.
pub fn explain(config: &Config, probe: &Probe) -> String {
    let mut out = String::new();
    let (raw_path, query) = match probe.target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (probe.target.as_str(), None),
    };
    let _ = writeln!(out, "request: {} {}", probe.method, probe.target);
    let path = match path::normalise(raw_path) {
        Ok(p) => p.into_owned(),
        Err(e) => {
            answer(&mut out, &GatewayError::from(e));
            return out;
        }
    };
    let _ = writeln!(out, "normalised path: {path}");
    // Routes and keys read the path with bytes outside ASCII percent-encoded.
    let path = path::match_form(&path).into_owned();
    let Some(route) = found(&mut out, config, &probe.method, &path) else {
        let _ = writeln!(out, "answer: forwarded to the upstream without dedupe");
        return out;
    };
    if !rules(&mut out, route) {
        let _ = writeln!(out, "answer: forwarded to the upstream without dedupe");
        return out;
    }
    if route.grpc {
        grpc::rules(&mut out, route);
    }
    if !signature(&mut out, route, probe) {
        return out;
    }
    if !probe.derive {
        let _ = writeln!(out, "(give -H and --body to derive the key)");
        return out;
    }
    // On a gRPC route `--body` is the message: framed as the client would send it.
    let framed;
    let body = match route.grpc {
        true => {
            framed = crate::protocol::grpc::frame::encode(&probe.body);
            &framed[..]
        }
        false => &probe.body[..],
    };
    let view = RequestView {
        method: &probe.method,
        path: &path,
        query,
        headers: &probe.headers,
        body,
    };
    derive(&mut out, config, route, &view);
    out
}

/// The route the request takes, told; `None` (and why) when it passes through.
fn found<'c>(
    out: &mut String,
    config: &'c Config,
    method: &Method,
    path: &str,
) -> Option<&'c Route> {
    let Some(i) = route::find(&config.routes, method, path) else {
        let _ = match config.routes.iter().find(|r| r.path.matches(path)) {
            Some(r) => writeln!(
                out,
                "route: passthrough (route {} matches the path but not {}; it lists {})",
                r.name,
                method,
                methods(r)
            ),
            None => writeln!(out, "route: passthrough (no route matches)"),
        };
        return None;
    };
    let route = &config.routes[i];
    let _ = writeln!(
        out,
        "route: {} ({} {})",
        route.name,
        methods(route),
        route.path.as_str()
    );
    Some(route)
}

/// The route's mode, key, scope and `match`, told; false when the route is off.
fn rules(out: &mut String, route: &Route) -> bool {
    let _ = match route.mode {
        Mode::Enforce => writeln!(out, "mode: enforce"),
        Mode::Shadow => writeln!(
            out,
            "mode: shadow (claimed and recorded, but always forwarded; what enforce would do is logged and counted)"
        ),
        Mode::Off => {
            let _ = writeln!(out, "mode: off");
            return false;
        }
    };
    let _ = match &route.key {
        KeyRule::Header {
            name,
            alias,
            required,
        } => writeln!(
            out,
            "key: header {name}{}, {}",
            alias
                .as_ref()
                .map(|a| format!(" (or {a} when it is absent)"))
                .unwrap_or_default(),
            if *required && route.grpc {
                "required (missing: INVALID_ARGUMENT)"
            } else if *required {
                "required (missing: 400)"
            } else {
                "optional (missing: forwarded without dedupe)"
            }
        ),
        KeyRule::Fingerprint(parts) => writeln!(out, "key: fingerprint of {}", list(parts)),
    };
    let _ = writeln!(
        out,
        "scope: {}",
        if route.scope.is_empty() {
            "none (keys are shared by every caller)".to_owned()
        } else {
            list(&route.scope)
        }
    );
    let _ = match &route.must_match {
        MatchRule::Request => writeln!(out, "match: the whole request"),
        MatchRule::Parts(p) if p.is_empty() => writeln!(out, "match: the key alone"),
        MatchRule::Parts(p) => writeln!(out, "match: {}", list(p)),
    };
    true
}

/// What the gateway does with the request: the route's one verdict, as the pipeline
/// reaches it (the header key first, then the whole request).
fn derive(out: &mut String, config: &Config, route: &Route, view: &RequestView<'_>) {
    let verdict = match route.verdict_from_headers(view.headers) {
        Some(skip) => Verdict::Skip(skip),
        None => route.verdict(config.store.namespace(), config.server.max_body, view),
    };
    let keyed = match verdict {
        Verdict::Claim(keyed) => keyed,
        Verdict::Skip(Skip::NoKey) => {
            let _ = writeln!(
                out,
                "answer: no key: forwarded to the upstream without dedupe"
            );
            return;
        }
        Verdict::Skip(Skip::Refused { error, forwarded }) => {
            let e = GatewayError::from(error);
            if forwarded {
                let _ = writeln!(
                    out,
                    "answer: forwarded (shadow mode); enforce would answer {} {}",
                    e.status().as_u16(),
                    e.problem_type()
                );
            } else if route.grpc {
                grpc::answer(out, &e);
            } else {
                answer(out, &e);
            }
            return;
        }
    };
    if let Some((_, o)) = &keyed.order {
        let _ = writeln!(out, "entity hash: {}", o.entity);
        let _ = writeln!(out, "version: {}", o.shown);
    }
    let _ = writeln!(out, "key value: {}", keyed.key);
    let _ = writeln!(out, "scope hash: {}", keyed.scope);
    let _ = writeln!(out, "store key: {}", keyed.store_key);
    let _ = writeln!(
        out,
        "{}",
        if route.mode == Mode::Shadow {
            "answer: claimed and recorded, and forwarded (shadow mode: a repeat is forwarded too, counted as would=replay, conflict or mismatch)"
        } else if route.grpc {
            "answer: claimed in the store (forwarded once; a repeat is replayed, ABORTED in flight, FAILED_PRECONDITION if different)"
        } else {
            "answer: claimed in the store (forwarded once; a repeat is replayed, 409 in flight, 422 if different)"
        }
    );
}

/// A signed route's signature, checked as the gateway checks it (at this moment's clock)
/// when a request was given; whether the explanation goes on.
fn signature(out: &mut String, route: &Route, probe: &Probe) -> bool {
    let Some(v) = &route.verify else {
        return true;
    };
    let scheme = v.scheme();
    let tolerance = if scheme.signs_timestamp() {
        format!(", tolerance {}", format_duration(v.tolerance()))
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "verify: {} ({}, {} secret(s){tolerance}), before the claim",
        scheme.as_str(),
        scheme.signature_header(),
        v.secret_count(),
    );
    if !probe.derive {
        return true;
    }
    match v.verify(&probe.headers, &probe.body, SystemTime::now()) {
        Ok(verified) => {
            let _ = writeln!(
                out,
                "signature: verifies (secret {} of {})",
                verified.secret + 1,
                v.secret_count()
            );
            true
        }
        Err(e) => {
            let _ = writeln!(out, "signature: does not verify: {e}");
            answer(out, &GatewayError::SignatureInvalid);
            false
        }
    }
}

fn answer(out: &mut String, e: &GatewayError) {
    let _ = write!(out, "answer: {} {}", e.status().as_u16(), e.problem_type());
    let _ = match e.client_detail() {
        Some(d) => writeln!(out, ": {d}"),
        None => writeln!(out),
    };
}

fn methods(r: &Route) -> String {
    r.methods
        .iter()
        .map(Method::as_str)
        .collect::<Vec<_>>()
        .join(",")
}

fn list(parts: &[RequestPart]) -> String {
    parts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn probe(line: &str, headers: &[(&'static str, &str)], body: &str) -> String {
        probe_on(
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/config/example.toml")),
            line,
            headers,
            body,
        )
    }

    pub(super) fn probe_on(
        toml: &str,
        line: &str,
        headers: &[(&'static str, &str)],
        body: &str,
    ) -> String {
        let config = Config::from_toml(toml).unwrap();
        let (method, target) = line.split_once(' ').unwrap();
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        explain(
            &config,
            &Probe {
                method: method.parse().unwrap(),
                target: target.to_owned(),
                headers: h,
                body: body.as_bytes().to_vec(),
                derive: !headers.is_empty() || !body.is_empty(),
            },
        )
    }

    #[test]
    fn a_routed_request_shows_its_key_and_scope() {
        let out = probe(
            "POST //v1/%70ayments/x?a=1",
            &[("idempotency-key", "\"k1\""), ("authorization", "Bearer a")],
            "",
        );
        assert!(out.contains("normalised path: /v1/payments/x\n"), "{out}");
        assert!(
            out.contains("route: payments (POST,PATCH /v1/payments/**)"),
            "{out}"
        );
        assert!(
            out.contains("key: header idempotency-key, required"),
            "{out}"
        );
        assert!(out.contains("scope: header:authorization\n"), "{out}");
        assert!(out.contains("key value: k1\n"), "{out}");
        assert!(out.contains("store key: dedupe:{"), "{out}");
    }

    #[test]
    fn passthrough_missing_keys_and_bad_paths_are_told() {
        let out = probe("POST /elsewhere", &[], "");
        assert!(
            out.contains("route: passthrough (no route matches)"),
            "{out}"
        );
        let out = probe("GET /v1/payments", &[], "");
        assert!(
            out.contains("route payments matches the path but not GET"),
            "{out}"
        );
        let out = probe("POST /v1/payments", &[("authorization", "x")], "");
        assert!(
            out.contains("answer: 400 urn:dedupe-gateway:problem:idempotency-key-missing"),
            "{out}"
        );
        let out = probe("POST /v1/a%2Fb", &[], "");
        assert!(
            out.contains("answer: 400 urn:dedupe-gateway:problem:path-invalid"),
            "{out}"
        );
        let out = probe("POST /webhooks/x", &[], "{}");
        assert!(out.contains("fingerprint-part-missing"), "{out}");
    }

    #[test]
    fn a_signed_route_tells_whether_the_signature_verifies_and_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "It's a Secret to Everybody\n").unwrap();
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9000\"\n\
             [[routes]]\nname = \"gh\"\nmethods = [\"POST\"]\npath = \"/gh\"\npreset = \"github\"\n\
             verify = {{ secrets = [\"file:{}\"] }}\n",
            secret.display()
        );
        // GitHub's documented example delivery.
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        let delivery = [
            ("x-github-delivery", "d-1"),
            ("x-github-hook-id", "1"),
            ("x-hub-signature-256", sig),
        ];
        let out = probe_on(&toml, "POST /gh", &delivery, "Hello, World!");
        assert!(
            out.contains("verify: github (X-Hub-Signature-256, 1 secret(s)), before the claim"),
            "{out}"
        );
        assert!(out.contains("signature: verifies (secret 1 of 1)"), "{out}");
        assert!(out.contains("answer: claimed"), "{out}");
        let out = probe_on(&toml, "POST /gh", &delivery, "Hello, World?");
        assert!(
            out.contains("signature: does not verify: no signature matches"),
            "{out}"
        );
        assert!(
            out.contains("answer: 401 urn:dedupe-gateway:problem:signature-invalid"),
            "{out}"
        );
        assert!(!out.contains("key value"), "{out}");
        let out = probe_on(&toml, "POST /gh", &[("x-github-delivery", "d-1")], "x");
        assert!(
            out.contains("does not verify: no x-hub-signature-256 header"),
            "{out}"
        );
        assert!(!out.contains("Everybody"), "{out}");
    }

    #[test]
    fn a_shadow_route_is_told_as_forwarded() {
        let toml = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/config/example.toml"))
            .replacen(
                "name = \"payments\"",
                "name = \"payments\"\nmode = \"shadow\"",
                1,
            );
        let out = probe_on(&toml, "POST /v1/payments", &[("authorization", "x")], "");
        assert!(
            out.contains("answer: forwarded (shadow mode); enforce would answer 400 urn:dedupe-gateway:problem:idempotency-key-missing"),
            "{out}"
        );
        let with_key = [("authorization", "x"), ("idempotency-key", "k")];
        let out = probe_on(&toml, "POST /v1/payments", &with_key, "");
        assert!(out.contains("and forwarded (shadow mode"), "{out}");
    }
}
