//! Validation of whole files: the errors a user sees, and the defaults they get.

use std::time::Duration;

use http::Method;

use super::*;
use crate::protocol::key::{KeyRule, RequestPart};

const BASE: &str = r#"
[server]
listen = "127.0.0.1:8080"
upstream = "http://127.0.0.1:9000/api/"
"#;

fn with(extra: &str) -> Result<Config, ConfigError> {
    Config::from_toml(&format!("{BASE}{extra}"))
}

fn err(extra: &str) -> String {
    with(extra).unwrap_err().to_string()
}

mod admin;
mod backends;
mod errors;
mod grpc;
mod secrets;
mod verify;

#[test]
fn the_issue_example_validates() {
    let c = Config::from_toml(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/example.toml"
    )))
    .unwrap();
    assert_eq!(c.routes.len(), 3);
    assert_eq!(c.routes[1].window, Duration::from_secs(72 * 3600));
    assert_eq!(c.routes[0].lease, Duration::from_secs(10));
    assert_eq!(c.server.max_body, 1024 * 1024);
}

#[test]
fn defaults_apply_and_routes_override() {
    let c = with(
        r#"
[defaults]
lease = "2s"
window = "1h"
[[routes]]
name = "a"
methods = ["POST"]
path = "/a"
key = { header = "Idempotency-Key" }
scope = []
[[routes]]
name = "b"
methods = ["POST"]
path = "/b/*"
key = { header = "Idempotency-Key", required = false }
scope = []
lease = "250ms"
on_error = "fail-open"
"#,
    )
    .unwrap();
    assert_eq!(c.server.upstream.base_path, "/api");
    assert_eq!(c.routes[0].lease, Duration::from_secs(2));
    assert_eq!(c.routes[0].methods, vec![Method::POST]);
    assert_eq!(c.routes[1].lease, Duration::from_millis(250));
    assert_eq!(c.routes[1].window, Duration::from_secs(3600));
    assert_eq!(c.routes[1].on_error, OnError::FailOpen);
    assert!(matches!(
        c.routes[1].key,
        KeyRule::Header {
            required: false,
            ..
        }
    ));
}

#[test]
fn unknown_fields_are_rejected_with_their_name() {
    let e = err(r#"
[[routes]]
name = "a"
methods = ["POST"]
path = "/a"
key = { header = "Idempotency-Key", requierd = true }
scope = []
"#);
    assert!(e.contains("requierd"), "{e}");
    let e = err("[defaults]\nleese = \"1s\"\n");
    assert!(e.contains("leese"), "{e}");
}

#[test]
fn bad_duration_names_the_route_and_field() {
    let e = err(r#"
[[routes]]
name = "payments"
methods = ["POST"]
path = "/a"
key = { header = "Idempotency-Key" }
scope = []
lease = "thirty seconds"
"#);
    assert!(e.starts_with("routes[payments].lease:"), "{e}");
    let e = err("[defaults]\nwindow = \"0s\"\n");
    assert!(e.contains("defaults.window"), "{e}");
}

#[test]
fn key_rules_are_checked() {
    let route = |key: &str| {
        format!("[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\nkey = {key}\n")
    };
    assert!(err(&route("{ }")).contains("routes[r].key"));
    assert!(err(&route(r#"{ header = "A", fingerprint = ["path"] }"#)).contains("exactly one"));
    assert!(err(&route(r#"{ fingerprint = [] }"#)).contains("at least one"));
    assert!(err(&route(r#"{ fingerprint = ["jsn:/a"] }"#)).contains("jsn:/a"));
    assert!(err(&route(r#"{ fingerprint = ["json:a"] }"#)).contains("JSON pointer"));
    assert!(err(&route(r#"{ header = "bad header" }"#)).contains("header name"));
}

#[test]
fn routes_need_unique_safe_names_methods_and_paths() {
    let r = |name: &str, methods: &str, path: &str| {
        format!("[[routes]]\nname = \"{name}\"\nmethods = {methods}\npath = \"{path}\"\nkey = {{ header = \"K\" }}\nscope = []\n")
    };
    assert!(err(&r("a:b", "[\"POST\"]", "/a")).contains("routes[a:b].name"));
    assert!(err(&r("a", "[]", "/a")).contains("routes[a].methods"));
    assert!(err(&r("a", "[\"PO ST\"]", "/a")).contains("not an HTTP method"));
    assert!(err(&r("a", "[\"POST\"]", "a")).contains("routes[a].path"));
    let twice = format!(
        "{}{}",
        r("a", "[\"POST\"]", "/a"),
        r("a", "[\"POST\"]", "/b")
    );
    assert!(err(&twice).contains("duplicate route name"));
}

#[test]
fn store_settings_are_checked() {
    assert!(err("[store]\nbackend = \"redis\"\n").contains("store.url"));
    assert!(err("[store]\nbackend = \"mongo\"\n").contains("mongo"));
    assert!(err("[store]\nbackend = \"redis\"\nurl = \"http://x\"\n").contains("redis://"));
    assert!(with("[store]\nbackend = \"redis\"\nurl = \"rediss://x:6380\"\n").is_ok());
    assert!(
        err("[store]\nbackend = \"redis\"\nurl = \"redis://x:notaport\"\n").contains("store.url")
    );
    assert!(err("[store]\nbackend = \"redis-cluster\"\nurls = []\n").contains("store.urls"));
    let c = with("[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"\ntimeout = \"100ms\"\non_error = \"fail-open\"\n").unwrap();
    assert_eq!(c.store.timeout, Duration::from_millis(100));
    assert!(
        matches!(&c.store.backend, StoreBackend::Redis { url, .. } if url == "redis://127.0.0.1:6379/0"),
        "{:?}",
        c.store.backend
    );
}

#[test]
fn server_settings_are_checked() {
    let e = Config::from_toml("[server]\nlisten = \"nope\"\nupstream = \"http://a:1\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("server.listen"), "{e}");
    let c = Config::from_toml("[server]\nlisten = \"127.0.0.1:1\"\nupstream = \"https://a:1\"\n")
        .unwrap();
    assert_eq!(c.server.upstream.scheme, http::uri::Scheme::HTTPS);
    let e = Config::from_toml("[server]\nlisten = \"127.0.0.1:1\"\nupstream = \"ftp://a:1\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("https://"), "{e}");
    let e = err("upstream_ca_file = \"/x\"\n");
    assert!(
        e.starts_with("server.upstream_ca_file: applies to an https://"),
        "{e}"
    );
    assert!(err("[admin]\nlisten = \"127.0.0.1:8080\"\n").contains("admin.listen"));
    let e = Config::from_toml(
        "[server]\nlisten = \"127.0.0.1:1\"\nupstream = \"http://a:1\"\nmax_body = \"lots\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("server.max_body"), "{e}");
}

#[test]
fn a_lease_too_short_to_renew_is_warned_about() {
    let route = |lease: &str| {
        format!("[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\nkey = {{ header = \"K\" }}\nscope = [\"header:Authorization\"]\nlease = \"{lease}\"\n")
    };
    // Renewed leases need not outlast the upstream timeout (30s here).
    assert!(with(&route("10s")).unwrap().warnings.is_empty());
    let c = with(&route("1500ms")).unwrap();
    assert_eq!(c.warnings.len(), 1);
    assert!(
        c.warnings[0].starts_with("routes[r].lease"),
        "{:?}",
        c.warnings
    );
    assert!(with(&route("1501ms")).unwrap().warnings.is_empty());
    // The embedded store has no `store.timeout` to run out: no warning cites it.
    let memory = route("1500ms").replace(
        "backend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"",
        "backend = \"memory\"",
    );
    assert!(with(&memory).unwrap().warnings.is_empty(), "{memory}");
}

#[test]
fn status_lists_and_on_unknown_parse_with_defaults_and_overrides() {
    use crate::protocol::route::{OnUnknown, StatusMeaning};
    let route =
        "[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\nkey = { header = \"K\" }\nscope = []\n";
    let c = with(route).unwrap();
    let r = &c.routes[0];
    assert_eq!(r.on_unknown, OnUnknown::Retry);
    assert_eq!(r.statuses.classify(429), StatusMeaning::Retry);
    assert_eq!(r.statuses.classify(408), StatusMeaning::Retry);
    assert_eq!(r.statuses.classify(500), StatusMeaning::Retry);
    assert_eq!(r.statuses.classify(504), StatusMeaning::Unknown);
    assert_eq!(r.statuses.classify(400), StatusMeaning::Final);
    let custom = format!(
        "{route}on_unknown = \"hold\"\nretry_statuses = [503]\nunknown_statuses = [\"5xx\", 408]\n"
    );
    let r = with(&custom).unwrap().routes.remove(0);
    assert_eq!(r.on_unknown, OnUnknown::Hold);
    assert_eq!(r.statuses.classify(503), StatusMeaning::Unknown);
    assert_eq!(r.statuses.classify(408), StatusMeaning::Unknown);
    assert_eq!(r.statuses.classify(429), StatusMeaning::Final);
    for (bad, field) in [
        ("retry_statuses = [99]", "routes[r].retry_statuses"),
        ("unknown_statuses = [\"6xx\"]", "routes[r].unknown_statuses"),
        ("on_unknown = \"later\"", "routes[r].on_unknown"),
    ] {
        let e = with(&format!("{route}{bad}\n")).unwrap_err().to_string();
        assert!(e.starts_with(field), "{bad}: {e}");
    }
}

#[test]
fn environment_overrides_apply_before_validation() {
    let mut f = FileConfig::parse(BASE).unwrap();
    f.apply_env(|k| match k {
        "DEDUPE_LISTEN" => Some("0.0.0.0:9999".into()),
        "DEDUPE_UPSTREAM" => Some("http://app:3000".into()),
        "DEDUPE_ADMIN_LISTEN" => Some("0.0.0.0:9901".into()),
        "DEDUPE_ADMIN_TOKEN" => Some("s3cret".into()),
        "DEDUPE_REDIS_URL" => Some("redis://redis:6379".into()),
        _ => None,
    });
    f.store.backend = Some(Backend::Redis);
    let c = Config::from_file(f).unwrap();
    assert_eq!(c.server.listen.port(), 9999);
    assert_eq!(c.server.upstream.authority.as_str(), "app:3000");
    let admin = c.admin.unwrap();
    assert_eq!(admin.listen.port(), 9901);
    assert_eq!(admin.token.as_deref(), Some("s3cret"));
    assert!(
        matches!(&c.store.backend, StoreBackend::Redis { url, .. } if url == "redis://redis:6379"),
        "{:?}",
        c.store.backend
    );
}

#[test]
fn replay_settings_are_checked() {
    let route = |extra: &str| {
        format!("[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\nkey = {{ header = \"K\" }}\nscope = []\n{extra}")
    };
    let c = with(&route("")).unwrap();
    assert!(c.routes[0].store_body && c.routes[0].advertise_expiry);
    assert!(c.routes[0].replay_drop_headers.is_empty());
    let c = with(&route(
        "store_body = false\nadvertise_expiry = false\nreplay_drop_headers = [\"X-Request-Id\", \"x-ratelimit-*\"]\n",
    ))
    .unwrap();
    assert!(!c.routes[0].store_body && !c.routes[0].advertise_expiry);
    assert_eq!(c.routes[0].replay_drop_headers.len(), 2);
    let e = err(&route("replay_drop_headers = [\"*\"]\n"));
    assert!(e.starts_with("routes[r].replay_drop_headers:"), "{e}");
    let e = err(&route("replay_drop_headers = [\"bad header\"]\n"));
    assert!(e.contains("not a header name"), "{e}");
}

#[test]
fn match_defaults_by_key_kind_and_names_its_errors() {
    use crate::protocol::key::{MatchRule, RequestPart};
    let route = |key: &str, extra: &str| {
        format!(
            "[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/r\"\nkey = {key}\nscope = []\n{extra}"
        )
    };
    let header = r#"{ header = "Idempotency-Key" }"#;
    let fp = r#"{ fingerprint = ["json:/id"] }"#;
    let m = |key: &str, extra: &str| {
        with(&route(key, extra)).unwrap().routes[0]
            .must_match
            .clone()
    };
    assert_eq!(m(header, ""), MatchRule::Request);
    assert_eq!(
        m(fp, ""),
        MatchRule::Parts(vec![RequestPart::Json("/id".into())])
    );
    assert_eq!(m(header, "match = \"key\""), MatchRule::Parts(vec![]));
    assert_eq!(m(fp, "match = \"request\""), MatchRule::Request);
    assert_eq!(
        m(header, "match = [\"method\", \"json:\"]"),
        MatchRule::Parts(vec![RequestPart::Method, RequestPart::Json(String::new())])
    );
    for (bad, says) in [
        (
            "match = \"whole\"",
            "routes[r].match: expected \"request\", \"key\" or a list of request parts",
        ),
        (
            "match = 5",
            "routes[r].match: expected \"request\", \"key\" or a list of request parts",
        ),
        (
            "match = []",
            "routes[r].match: must list at least one request part",
        ),
        (
            "match = [\"cookie:a\"]",
            "routes[r].match: \"cookie:a\" is not a request part",
        ),
    ] {
        let e = err(&route(header, bad));
        assert!(e.starts_with(says), "{bad}: {e}");
    }
}

#[test]
fn mode_defaults_to_enforce_and_a_typo_names_the_field_and_the_choices() {
    let route = |mode: &str| {
        format!(
            "[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\nkey = {{ header = \"K\" }}\nscope = []\n{mode}"
        )
    };
    assert_eq!(
        with(&route("")).unwrap().routes[0].mode,
        crate::protocol::route::Mode::Enforce
    );
    let shadow = with(&route("mode = \"shadow\"\n")).unwrap();
    assert_eq!(shadow.routes[0].mode, crate::protocol::route::Mode::Shadow);
    let e = err(&route("mode = \"shadw\"\n"));
    assert!(e.contains("routes[r].mode"), "{e}");
    assert!(e.contains("enforce") && e.contains("off"), "{e}");
}

#[test]
fn durations_print_in_the_file_s_own_units_and_parse_back() {
    use super::format_duration;
    use std::time::Duration;
    for (d, text) in [
        (Duration::from_secs(365 * 86_400), "365d"),
        (Duration::from_secs(86_400), "1d"),
        (Duration::from_secs(5400), "1h 30m"),
        (Duration::from_millis(250), "250ms"),
        (Duration::from_millis(1500), "1s 500ms"),
        (Duration::ZERO, "0s"),
    ] {
        assert_eq!(format_duration(d), text);
        assert_eq!(
            super::parse::duration_allow_zero("x", text, Duration::MAX).unwrap(),
            d
        );
    }
}

#[test]
fn order_rules_are_checked() {
    let route = |order: &str| {
        format!(
            "[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\n\
             key = {{ header = \"Idempotency-Key\" }}\nscope = []\norder = {order}\n"
        )
    };
    let c = with(&route(r#"{ entity = "json:/id", version = "header:x-v" }"#)).unwrap();
    let order = c.routes[0].order.as_ref().unwrap();
    assert_eq!(order.compare, crate::protocol::key::order::Compare::Integer);
    assert_eq!(order.version, RequestPart::parse("header:x-v").unwrap());
    let e = err(&route(r#"{ entity = "jsn:/id", version = "json:/v" }"#));
    assert!(e.contains("routes[r].order.entity"), "{e}");
    let e = err(&route(
        r#"{ entity = "json:/id", version = "json:/v", compare = "float" }"#,
    ));
    assert!(e.contains("float"), "{e}");
    let e = err(&route(r#"{ entity = "json:/id" }"#));
    assert!(e.contains("version"), "{e}");
    // On a cluster too: records then take their entity's hash tag.
    let c = with(&format!(
        "[store]\nbackend = \"redis-cluster\"\nurls = [\"redis://127.0.0.1:7000\"]\n{}",
        route(r#"{ entity = "json:/id", version = "json:/v", compare = "timestamp" }"#)
    ))
    .unwrap();
    assert!(c.store.tags_by_entity() && c.routes[0].order.is_some());
}

#[test]
fn a_header_key_needs_a_scope_written_and_a_preset_or_fingerprint_does_not() {
    let route = |key: &str, extra: &str| {
        format!("[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/r\"\n{key}\n{extra}")
    };
    let header = "key = { header = \"Idempotency-Key\" }";
    let e = err(&route(header, ""));
    assert!(
        e.starts_with("routes[r].scope: required with a header key"),
        "{e}"
    );
    assert!(
        e.contains("scope = []") && e.contains("header:Authorization"),
        "{e}"
    );
    // Written, even empty, it is the file saying one caller: no error, no warning.
    let c = with(&route(header, "scope = []")).unwrap();
    assert!(
        c.routes[0].scope.is_empty() && c.warnings.is_empty(),
        "{:?}",
        c.warnings
    );
    // A webhook preset's sender is one provider; its own header key keeps the exemption.
    for preset in [
        "preset = \"standard-webhooks\"",
        "preset = \"shopify\"\nkey = { header = \"X-Shopify-Event-Id\" }",
    ] {
        with(&route(preset, "")).unwrap();
    }
    // A fingerprint is the request's own content, not a value each caller picks.
    with(&route("key = { fingerprint = [\"json:/id\"] }", "")).unwrap();
}
