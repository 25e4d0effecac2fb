use super::*;
use crate::config::Config;

fn routes() -> Vec<Route> {
    Config::from_toml(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/example.toml"
    )))
    .unwrap()
    .routes
}

fn name(method: Method, path: &str) -> Option<String> {
    let routes = routes();
    find(&routes, &method, path).map(|i| routes[i].name.to_string())
}

#[test]
fn exact_and_prefix_paths() {
    assert_eq!(
        name(Method::POST, "/v1/payments/42").as_deref(),
        Some("payments")
    );
    assert_eq!(
        name(Method::POST, "/v1/payments/42/refunds").as_deref(),
        Some("payments")
    );
    assert_eq!(
        name(Method::POST, "/v1/payments").as_deref(),
        Some("payments"),
        "a collection pattern covers the collection itself"
    );
    assert_eq!(name(Method::POST, "/v1/payments/"), Some("payments".into()));
    assert_eq!(name(Method::POST, "/v1/paymentsX"), None);
    assert_eq!(
        name(Method::POST, "/webhooks/shopify").as_deref(),
        Some("shopify-orders")
    );
    assert_eq!(
        name(Method::POST, "/webhooks/stripe").as_deref(),
        Some("generic-webhooks")
    );
    assert_eq!(name(Method::POST, "/other"), None);
}

#[test]
fn first_match_wins_and_methods_filter_it() {
    // `/webhooks/shopify` matches shopify-orders first; a GET there matches nothing
    // rather than falling through to generic-webhooks.
    assert_eq!(name(Method::GET, "/webhooks/shopify"), None);
    assert_eq!(
        name(Method::PATCH, "/v1/payments/1").as_deref(),
        Some("payments")
    );
    assert_eq!(name(Method::GET, "/v1/payments/1"), None);
}

#[test]
fn statuses_classify_unknown_before_retry() {
    let policy = StatusPolicy {
        retry: vec![StatusSpec::Code(429), StatusSpec::Class(5)],
        unknown: vec![StatusSpec::Code(504)],
    };
    assert_eq!(policy.classify(429), StatusMeaning::Retry);
    assert_eq!(policy.classify(503), StatusMeaning::Retry);
    assert_eq!(policy.classify(504), StatusMeaning::Unknown);
    assert_eq!(policy.classify(409), StatusMeaning::Final);
    assert_eq!(policy.classify(201), StatusMeaning::Final);
}

#[test]
fn header_patterns_drop_names_and_prefixes_only() {
    let patterns: Vec<HeaderPattern> = ["X-Request-Id", "x-ratelimit-*"]
        .iter()
        .map(|p| HeaderPattern::new(p).unwrap())
        .collect();
    let mut h = HeaderMap::new();
    for name in [
        "x-request-id",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-request-idx",
        "content-type",
        "date",
    ] {
        h.insert(HeaderName::from_static(name), "1".parse().unwrap());
    }
    drop_headers(&patterns, &mut h);
    let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
    left.sort_unstable();
    assert_eq!(left, ["content-type", "date", "x-request-idx"]);
    assert!(HeaderPattern::new("*").is_err());
    assert!(HeaderPattern::new("bad header").is_err());
    assert!(HeaderPattern::new("x bad*").is_err());
}

#[test]
fn patterns_must_be_absolute_valid_and_normalised() {
    assert!(PathPattern::new("v1").is_err());
    assert!(PathPattern::new("/a/[").is_err());
    for unnormal in ["/v1//payments/*", "/v1/./x", "/v1/%70ayments", "/a/../b"] {
        let e = PathPattern::new(unnormal).unwrap_err();
        assert!(e.contains("normalised"), "{e}");
    }
    assert!(PathPattern::new("/a/%2F").is_err());
    assert!(PathPattern::new("/a\\b").is_err());
    // Raw UTF-8 is written as requests are matched: percent-encoded.
    let e = PathPattern::new("/v1/caf\u{e9}/**").unwrap_err();
    assert!(e.contains("/v1/caf%C3%A9/**"), "{e}");
    let p = PathPattern::new("/a/*/b").unwrap();
    assert!(p.matches("/a/x/b"));
    assert!(!p.matches("/a/x/c"));
}

#[test]
fn collections_match_themselves_and_everything_below() {
    let p = PathPattern::new("/v1/payments/**").unwrap();
    for yes in [
        "/v1/payments",
        "/v1/payments/",
        "/v1/payments/x",
        "/v1/payments/x/y",
    ] {
        assert!(p.matches(yes), "{yes}");
    }
    for no in ["/v1/paymentsX", "/v1/payment", "/v1", "/v2/payments"] {
        assert!(!p.matches(no), "{no}");
    }
    let all = PathPattern::new("/**").unwrap();
    assert!(all.matches("/") && all.matches("/a/b"));
    let g = PathPattern::new("/v*/payments/**").unwrap();
    assert!(g.matches("/v1/payments") && g.matches("/v2/payments/x"));
    assert!(!g.matches("/v1/paymentsX"));
}

#[test]
fn a_trailing_star_matches_as_the_glob_does_without_it() {
    // `prefix*` is matched by its prefix alone; the glob it stands for must agree.
    let paths = [
        "/",
        "/v1",
        "/v1/",
        "/v1/payments",
        "/v1/payments/",
        "/v1/payments/1",
        "/v1/payments/1/refunds",
        "/v1/paymentsX",
        "/v1/payments%2F1",
        "/v2/payments/1",
        "/v1/payments/a*b",
        "/v1/payments/%C3%A9",
    ];
    for pattern in ["/v1/payments/*", "/v1/pay*", "/*", "/v1/payments/x-*"] {
        let fast = PathPattern::new(pattern).unwrap();
        assert!(matches!(fast.shape, Shape::Prefix(_)), "{pattern}");
        let slow = glob(pattern).unwrap();
        for path in paths {
            assert_eq!(
                fast.matches(path),
                slow.is_match(path),
                "{pattern} on {path}"
            );
        }
    }
    for globbed in ["/v1/*/x", "/v1/pay?ents/*", "/v1/[ab]/*", "/v1/**/x*"] {
        let p = PathPattern::new(globbed).unwrap();
        assert!(matches!(p.shape, Shape::Glob(..)), "{globbed}");
    }
}

#[test]
fn coverage_between_patterns() {
    let p = |s: &str| PathPattern::new(s).unwrap();
    assert!(p("/webhooks/*").covers(&p("/webhooks/shopify")));
    assert!(p("/webhooks/*").covers(&p("/webhooks/shopify/**")));
    assert!(p("/webhooks/**").covers(&p("/webhooks")));
    assert!(p("/webhooks/**").covers(&p("/webhooks/a*")));
    assert!(p("/**").covers(&p("/anything/**")));
    assert!(p("/a").covers(&p("/a")));
    assert!(!p("/webhooks/shopify").covers(&p("/webhooks/*")));
    assert!(
        !p("/webhooks/*").covers(&p("/webhooks/**")),
        "misses /webhooks"
    );
    assert!(!p("/webhooks/**").covers(&p("/webhooksX")));
    assert!(
        !p("/v1/*/x").covers(&p("/v1/a/**")),
        "unknown is not covered"
    );
}
