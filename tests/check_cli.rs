//! `check --request` and `check`'s lints, on the real binary.

use std::process::Command;

fn gateway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
}

const BASE: &str = "[server]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9000\"\n";

/// Runs `check` on `text` with `args`; returns the exit code, stdout and stderr.
fn check(text: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gateway.toml");
    std::fs::write(&p, text).unwrap();
    let out = gateway()
        .arg("check")
        .arg("--config")
        .arg(&p)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn example() -> String {
    std::fs::read_to_string("config/example.toml").unwrap()
}

#[test]
fn request_on_a_route_shows_the_normalised_path_key_and_scope() {
    let (code, out, err) = check(
        &example(),
        &[
            "--request",
            "POST /x/../v1/%70ayments/42?a=1",
            "-H",
            "Idempotency-Key: \"k1\"",
            "-H",
            "Authorization: Bearer a",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    for line in [
        "normalised path: /v1/payments/42\n",
        "route: payments (POST,PATCH /v1/payments/**)\n",
        "key: header idempotency-key, required (missing: 400)\n",
        "scope: header:authorization\n",
        "match: the whole request\n",
        "key value: k1\n",
        "scope hash: ",
        "store key: dedupe:{",
    ] {
        assert!(out.contains(line), "{line:?} not in\n{out}");
    }
    // Without headers: the route's rules, no key.
    let (code, out, _) = check(&example(), &["--request", "POST /v1/payments"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("route: payments"), "{out}");
    assert!(!out.contains("key value"), "{out}");
}

#[test]
fn request_passthrough_missing_key_and_bad_path_are_told() {
    let (code, out, _) = check(&example(), &["--request", "POST /elsewhere", "-H", "A: b"]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("route: passthrough (no route matches)"),
        "{out}"
    );
    let (_, out, _) = check(&example(), &["--request", "DELETE /v1/payments/1"]);
    assert!(
        out.contains("route: passthrough (route payments matches the path but not DELETE; it lists POST,PATCH)"),
        "{out}"
    );
    let (code, out, _) = check(
        &example(),
        &["--request", "POST /v1/payments", "-H", "Authorization: a"],
    );
    assert_eq!(code, Some(0));
    assert!(
        out.contains("answer: 400 urn:dedupe-gateway:problem:idempotency-key-missing: the idempotency-key header is required on this route"),
        "{out}"
    );
    let (_, out, _) = check(&example(), &["--request", "POST /v1/a%2Fb"]);
    assert!(
        out.contains("answer: 400 urn:dedupe-gateway:problem:path-invalid"),
        "{out}"
    );
    let (_, out, _) = check(
        &example(),
        &[
            "--request",
            "POST /webhooks/x",
            "--body",
            "{\"order_id\":1}",
        ],
    );
    assert!(out.contains("fingerprint-part-missing"), "{out}");
}

#[test]
fn a_malformed_request_or_header_is_exit_64() {
    for args in [
        &["--request", "POST"][..],
        &["--request", "P OST /x"],
        &["--request", "POST x"],
        &["--request", "POST /x", "-H", "no colon"],
    ] {
        let (code, _, err) = check(&example(), args);
        assert_eq!(code, Some(64), "{args:?}: {err}");
        assert!(err.starts_with("dedupe-gateway: "), "{err}");
    }
}

fn route(name: &str, methods: &str, path: &str, rest: &str) -> String {
    format!("[[routes]]\nname = \"{name}\"\nmethods = [{methods}]\npath = \"{path}\"\n{rest}\n")
}

#[test]
fn lints_warn_and_strict_fails_on_them() {
    let scoped = "key = { header = \"Idempotency-Key\" }\nscope = [\"header:Authorization\"]";
    let cases: [(String, &str); 7] = [
        (
            format!(
                "{}{}",
                route("all", "\"POST\"", "/v1/**", scoped),
                route("payments", "\"PATCH\"", "/v1/payments/*", scoped)
            ),
            "routes[payments] can never match: routes[all] comes first",
        ),
        (
            format!(
                "{}{}",
                route("a", "\"POST\"", "/a", scoped),
                route("b", "\"POST\"", "/a", scoped)
            ),
            "routes[b] can never match",
        ),
        (
            route(
                "p",
                "\"POST\"",
                "/p",
                "key = { header = \"Idempotency-Key\" }",
            ),
            "routes[p].scope: a header key without scope is shared by every caller",
        ),
        (
            route(
                "h",
                "\"POST\"",
                "/h",
                "key = { fingerprint = [\"json:/id\", \"header:Date\"] }",
            ),
            "routes[h].key.fingerprint: header:date is a per-request id",
        ),
        (
            route(
                "h",
                "\"POST\"",
                "/h",
                "key = { fingerprint = [\"header:X-Request-Id\"] }",
            ),
            "routes[h].key.fingerprint: header:x-request-id",
        ),
        (
            route(
                "h",
                "\"POST\"",
                "/h",
                "key = { fingerprint = [\"path\", \"body\"] }",
            ),
            "routes[h].key.fingerprint: body is the raw body",
        ),
        (
            route("g", "\"GET\", \"POST\"", "/g", scoped),
            "routes[g].methods: GET is safe",
        ),
    ];
    for (routes, says) in &cases {
        let text = format!("{BASE}{routes}");
        let (code, out, err) = check(&text, &[]);
        assert_eq!(code, Some(0), "{err}");
        assert!(
            out.contains(&format!("warning: {says}")),
            "{says:?} not in\n{out}"
        );
        let (code, _, err) = check(&text, &["--strict"]);
        assert_eq!(code, Some(1), "--strict fails on: {says}");
        assert!(err.contains("--strict: 1 warning(s)"), "{err}");
    }
    let zero = BASE.replace("upstream =", "max_body = \"0\"\nupstream =");
    let (_, out, _) = check(&zero, &[]);
    assert!(
        out.contains("warning: server.max_body: 0 refuses every deduped request"),
        "{out}"
    );
    // A fingerprint route's own parts in `match` are not warned about twice; a header
    // route's `match` list is checked.
    let text = format!(
        "{BASE}{}",
        route(
            "m",
            "\"POST\"",
            "/m",
            &format!("{scoped}\nmatch = [\"json:/a\", \"header:Traceparent\"]")
        )
    );
    let (_, out, _) = check(&text, &[]);
    assert!(
        out.contains("warning: routes[m].match: header:traceparent"),
        "{out}"
    );
}

#[test]
fn every_shipped_config_passes_strict() {
    for dir in ["config", "docker"] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                // The deployment files take the admin token from a secret, as a container
                // gets it.
                let out = gateway()
                    .args(["check", "--strict", "--config"])
                    .arg(&path)
                    .env("DEDUPE_ADMIN_TOKEN", "from-a-secret")
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}: {}{}",
                    path.display(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

/// Every file the gateway reads is bounded: a key file, a certificate or a private key that
/// is `/dev/zero` is refused at once (exit 64) instead of growing `check` without end.
#[test]
fn endless_key_and_certificate_files_are_refused_with_their_name() {
    let with_key = format!("{BASE}[store]\nencryption_keys = [\"file:/dev/zero\"]\n");
    let with_cert = BASE
        .replace("http://", "https://")
        .replace("upstream =", "upstream_ca_file = \"/dev/zero\"\nupstream =");
    let with_tls =
        format!("{BASE}[server.tls]\ncert_file = \"/dev/zero\"\nkey_file = \"/dev/zero\"\n");
    for (text, names) in [
        (with_key, "store.encryption_keys[0]"),
        (with_cert, "/dev/zero"),
        (with_tls, "/dev/zero"),
    ] {
        let started = std::time::Instant::now();
        let (code, out, err) = check(&text, &[]);
        assert_eq!(code, Some(64), "{text}\n{out}\n{err}");
        assert!(err.contains(names), "{err}");
        assert!(err.contains("larger than"), "{err}");
        // A liveness bound: it stopped reading rather than reading 6 GB.
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
    }
}

#[test]
fn check_names_a_signed_routes_scheme_and_says_why_a_signature_fails_never_a_secret() {
    let text = format!(
        "{BASE}[[routes]]\nname = \"stripe\"\nmethods = [\"POST\"]\npath = \"/stripe\"\n\
         preset = \"stripe\"\nverify = {{ secrets = [\"env:STRIPE_NEW\", \"env:STRIPE_OLD\"] }}\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gateway.toml");
    std::fs::write(&p, text).unwrap();
    let run = |args: &[&str]| {
        let out = gateway()
            .args(["check", "--config"])
            .arg(&p)
            .args(args)
            .env("STRIPE_NEW", "whsec_the_new_one")
            .env("STRIPE_OLD", "whsec_the_old_one")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let routes = run(&[]);
    assert!(routes.contains(" verify=stripe (2 secret(s))"), "{routes}");
    // Stripe's library signed this with another secret.
    let old = "t=1700000000,v1=0c8670ed117751cc551a20e35839447075c42800ea3cf3e8a2fbda99cd1e6edd";
    let out = run(&[
        "--request",
        "POST /stripe",
        "-H",
        &format!("Stripe-Signature: {old}"),
        "--body",
        r#"{"id":"evt_1","object":"event"}"#,
    ]);
    assert!(
        out.contains("verify: stripe (Stripe-Signature, 2 secret(s), tolerance 5m)"),
        "{out}"
    );
    assert!(out.contains("signature: does not verify: no signature matches one made with the route's 2 secret(s)"), "{out}");
    assert!(
        out.contains("answer: 401 urn:dedupe-gateway:problem:signature-invalid"),
        "{out}"
    );
    for shown in [&routes, &out] {
        assert!(
            !shown.contains("the_new_one") && !shown.contains("the_old_one"),
            "{shown}"
        );
    }
}
