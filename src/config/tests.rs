//! Validation of whole files: the errors a user sees, and the defaults they get.

use std::time::Duration;

use http::Method;

use super::*;
use crate::key::{KeyRule, RequestPart};

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

#[test]
fn the_issue_example_validates() {
    let c = Config::from_toml(include_str!("../../config/example.toml")).unwrap();
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
[[routes]]
name = "b"
methods = ["POST"]
path = "/b/*"
key = { header = "Idempotency-Key", required = false }
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
        format!("[[routes]]\nname = \"{name}\"\nmethods = {methods}\npath = \"{path}\"\nkey = {{ header = \"K\" }}\n")
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
    assert_eq!(c.store.urls, vec!["redis://127.0.0.1:6379/0".to_owned()]);
}

#[test]
fn sentinel_settings_are_checked() {
    let s = "[store]\nbackend = \"redis-sentinel\"\n";
    let one = "sentinels = [\"redis://127.0.0.1:26379\"]\n";
    assert!(err(&format!("{s}master_name = \"m\"\n")).starts_with("store.sentinels: at least one"));
    assert!(err(&format!("{s}{one}")).starts_with("store.master_name: required"));
    assert!(err(&format!("{s}{one}master_name = \"a b\"\n")).starts_with("store.master_name"));
    assert!(err(&format!(
        "{s}{one}master_name = \"m\"\nurl = \"redis://h:1\"\n"
    ))
    .starts_with("store.url"));
    let mixed = "sentinels = [\"redis://a:1\", \"rediss://b:1\"]\nmaster_name = \"m\"\n";
    assert!(err(&format!("{s}{mixed}")).starts_with("store.sentinels: all redis://"));
    assert!(err(&format!(
        "{s}sentinels = [\"http://a:1\"]\nmaster_name = \"m\"\n"
    ))
    .starts_with("store.sentinels"));
    assert!(
        err("[store]\nbackend = \"redis\"\nurl = \"redis://h:1\"\nmaster_name = \"m\"\n")
            .starts_with("store.master_name: applies")
    );
    assert!(err(
        "[store]\nbackend = \"redis\"\nurl = \"redis://h:1\"\nsentinels = [\"redis://h:2\"]\n"
    )
    .starts_with("store.sentinels: applies"));
    let c = with(&format!("{s}sentinels = [\"redis://u:pw@a:26379\", \"redis://b:26379\"]\nmaster_name = \"mymaster\"\n")).unwrap();
    assert_eq!(c.store.backend, Backend::RedisSentinel);
    assert_eq!(c.store.urls.len(), 2);
    assert_eq!(c.store.master_name.as_deref(), Some("mymaster"));
    assert!(!format!("{:?}", c.store).contains("pw"));
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
        format!("[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\nkey = {{ header = \"K\" }}\nscope = [\"header:Authorization\"]\nlease = \"{lease}\"\n")
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
}

#[test]
fn status_lists_and_on_unknown_parse_with_defaults_and_overrides() {
    use crate::route::{OnUnknown, StatusMeaning};
    let route =
        "[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\nkey = { header = \"K\" }\n";
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
        "DEDUPE_REDIS_URL" => Some("redis://redis:6379".into()),
        _ => None,
    });
    f.store.backend = Some(Backend::Redis);
    let c = Config::from_file(f).unwrap();
    assert_eq!(c.server.listen.port(), 9999);
    assert_eq!(c.server.upstream.authority.as_str(), "app:3000");
    assert_eq!(c.admin.unwrap().listen.port(), 9901);
    assert_eq!(c.store.urls, vec!["redis://redis:6379".to_owned()]);
}

#[test]
fn encryption_keys_are_read_checked_and_never_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let hex_key = "ab".repeat(32);
    let good = dir.path().join("good");
    std::fs::write(&good, format!("{hex_key}\n")).unwrap();
    let raw = dir.path().join("raw");
    std::fs::write(&raw, [0x5a; 32]).unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, "cd".repeat(20)).unwrap();
    let keys = |list: &str| format!("[store]\nencryption_keys = {list}\n");
    let env_key = "ef".repeat(32);
    let load = |list: &str| {
        let mut f = FileConfig::parse(&format!("{BASE}{}", keys(list))).unwrap();
        let env = |k: &str| (k == "DEDUPE_KEY_1").then(|| env_key.clone());
        f.apply_env(env);
        Config::from_file_in(f, &env)
    };

    let c = load(&format!(
        "[\"file:{}\", \"file:{}\", \"env:DEDUPE_KEY_1\"]",
        good.display(),
        raw.display()
    ))
    .unwrap();
    assert_eq!(c.store.encryption.key_ids().len(), 3);
    let shown = format!("{c:?}");
    assert!(!shown.contains(&hex_key[..16]) && !shown.contains(&env_key[..16]));
    assert!(!with("").unwrap().store.encryption.is_enabled());

    let e = load(&format!("[\"file:{}\"]", short.display()))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("store.encryption_keys[0]: the key file"),
        "{e}"
    );
    assert!(e.contains("holds 40 bytes"), "{e}");
    assert!(!e.contains("cdcd"), "{e}");
    let e = load("[\"file:/nonexistent/key\"]").unwrap_err().to_string();
    assert!(e.contains("cannot read the key file"), "{e}");
    let e = load("[\"env:DEDUPE_KEY_2\"]").unwrap_err().to_string();
    assert!(e.contains("DEDUPE_KEY_2 is not set"), "{e}");
    let e = load("[\"/run/key\"]").unwrap_err().to_string();
    assert!(e.contains("file:"), "{e}");
    let e = load(&format!(
        "[\"file:{}\", \"env:DEDUPE_KEY_1\", \"file:{}\"]",
        good.display(),
        good.display()
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("store.encryption_keys[2]: is the same key"),
        "{e}"
    );
}

#[test]
fn redis_urls_never_show_their_password() {
    assert_eq!(
        redact_url("rediss://app:s3cret@redis.example:6380/0"),
        "rediss://app:***@redis.example:6380/0"
    );
    assert_eq!(redact_url("redis://:s3cret@h:1"), "redis://:***@h:1");
    assert_eq!(redact_url("redis://s3cret@h:1"), "redis://***@h:1");
    assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
    // Neither an error nor the config's Debug carries it.
    let e = err("[store]\nbackend = \"redis\"\nurl = \"ftp://app:s3cret@h:1\"\n");
    assert!(!e.contains("s3cret") && e.contains("app:***@h:1"), "{e}");
    let c = with("[store]\nbackend = \"redis\"\nurl = \"rediss://app:s3cret@h:1\"\n").unwrap();
    assert!(!format!("{c:?}").contains("s3cret"));
}

#[test]
fn redis_tls_fields_are_checked_and_name_themselves() {
    let redis = "[store]\nbackend = \"redis\"\n";
    let e = err(&format!(
        "{redis}url = \"redis://h:1\"\ntls_ca_file = \"/x\"\n"
    ));
    assert!(
        e.starts_with("store.tls_ca_file: applies to rediss://"),
        "{e}"
    );
    let e = err(&format!(
        "{redis}url = \"rediss://h:1\"\ntls_ca_file = \"/nonexistent/ca.pem\"\n"
    ));
    assert!(
        e.starts_with("store.tls_ca_file: /nonexistent/ca.pem: cannot read"),
        "{e}"
    );
    let e = err(&format!(
        "{redis}url = \"rediss://h:1\"\ntls_cert_file = \"/x\"\n"
    ));
    assert!(e.starts_with("store.tls_key_file: required"), "{e}");
    let e = err(&format!("{redis}url = \"rediss://h:1/#insecure\"\n"));
    assert!(e.contains("store.tls_insecure"), "{e}");
    let c = with(&format!(
        "{redis}url = \"rediss://h:1\"\ntls_insecure = true\n"
    ))
    .unwrap();
    assert!(c.store.access.insecure);
    assert!(
        c.warnings.iter().any(|w| w.contains("tls_insecure")),
        "{:?}",
        c.warnings
    );
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let e = err(&format!(
        "{redis}url = \"rediss://h:1\"\ntls_ca_file = \"{}\"\n",
        junk.display()
    ));
    assert!(
        e.contains("store.tls_ca_file") && e.contains("no PEM certificate"),
        "{e}"
    );
}

#[test]
fn replay_settings_are_checked() {
    let route = |extra: &str| {
        format!("[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\nkey = {{ header = \"K\" }}\n{extra}")
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
    use crate::key::{MatchRule, RequestPart};
    let route = |key: &str, extra: &str| {
        format!(
            "[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/r\"\nkey = {key}\n{extra}"
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
fn the_redis_password_comes_from_the_environment_and_is_never_shown() {
    let mut file = FileConfig::parse(&format!(
        "{BASE}[store]\nbackend = \"redis\"\nurl = \"rediss://app@h:1\"\n"
    ))
    .unwrap();
    file.apply_env(|k| (k == "DEDUPE_REDIS_PASSWORD").then(|| "pw-from-env".to_owned()));
    let c = Config::from_file(file).unwrap();
    assert_eq!(c.store.access.password.as_deref(), Some("pw-from-env"));
    assert!(!format!("{c:?}").contains("pw-from-env"));
}

#[test]
fn listener_tls_files_are_checked_and_name_their_field() {
    let ca = dedupe_test_support::TestCa::new("config");
    let (a, b) = (ca.issue("a"), ca.issue("b"));
    let tls = |cert: &std::path::Path, key: &std::path::Path| {
        format!(
            "[server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            cert.display(),
            key.display()
        )
    };
    let c = with(&tls(&a.cert, &a.key)).unwrap();
    assert!(c.server.tls.is_some());
    let e = err(&tls(&a.cert, &b.key));
    assert!(
        e.starts_with("server.tls.key_file: ") && e.contains("does not match"),
        "{e}"
    );
    let e = err(&tls(&a.key, &a.key));
    assert!(
        e.starts_with("server.tls.cert_file: ") && e.contains("no PEM certificate"),
        "{e}"
    );
    let e = err(&tls(std::path::Path::new("/nonexistent.pem"), &a.key));
    assert!(
        e.starts_with("server.tls.cert_file: /nonexistent.pem: cannot read"),
        "{e}"
    );
}

#[test]
fn mode_defaults_to_enforce_and_a_typo_names_the_field_and_the_choices() {
    let route = |mode: &str| {
        format!(
            "[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\nkey = {{ header = \"K\" }}\n{mode}"
        )
    };
    assert_eq!(
        with(&route("")).unwrap().routes[0].mode,
        crate::route::Mode::Enforce
    );
    let shadow = with(&route("mode = \"shadow\"\n")).unwrap();
    assert_eq!(shadow.routes[0].mode, crate::route::Mode::Shadow);
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
fn near_cache_is_a_size_on_the_redis_backend_only() {
    let redis = "[store]\nbackend = \"redis\"\nurl = \"redis://h:1\"\n";
    let c = with(&format!("{redis}near_cache = \"8MiB\"\n")).unwrap();
    assert_eq!(c.store.near_cache, 8 * 1024 * 1024);
    assert_eq!(with(redis).unwrap().store.near_cache, 0, "off by default");
    assert!(err(&format!("{redis}near_cache = \"lots\"\n")).starts_with("store.near_cache"));
    let cluster = "[store]\nbackend = \"redis-cluster\"\nurls = [\"redis://h:1\"]\n";
    assert!(
        err(&format!("{cluster}near_cache = \"8MiB\"\n")).starts_with("store.near_cache: applies")
    );
    assert!(err("[store]\nnear_cache = \"1MiB\"\n").starts_with("store.near_cache: applies"));
}

#[test]
fn order_rules_are_checked() {
    let route = |order: &str| {
        format!(
            "[[routes]]\nname = \"r\"\nmethods = [\"POST\"]\npath = \"/a\"\n\
             key = {{ header = \"Idempotency-Key\" }}\norder = {order}\n"
        )
    };
    let c = with(&route(r#"{ entity = "json:/id", version = "header:x-v" }"#)).unwrap();
    let order = c.routes[0].order.as_ref().unwrap();
    assert_eq!(order.compare, crate::key::order::Compare::Integer);
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
