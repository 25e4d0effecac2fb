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
    let cases: [(String, &str); 6] = [
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

/// A key file, a certificate or a private key that is `/dev/zero` is refused at once
/// (exit 64) instead of growing `check` without end: it is not a regular file. (A regular
/// file is bounded too, in `files.rs`'s tests.)
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
        assert!(
            err.contains("not a regular file but a character device"),
            "{err}"
        );
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

/// Runs `check` on `text` with a deadline: a `check` that blocks (on a FIFO, say) is
/// killed and reported rather than hanging the test run.
fn check_within(text: &str, envs: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gateway.toml");
    std::fs::write(&p, text).unwrap();
    let mut child = gateway()
        .arg("check")
        .arg("--config")
        .arg(&p)
        .envs(envs.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("check did not finish: it blocked on\n{text}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A route in `path` (a TOML literal string, so a regex's backslash stays one) keyed by
/// a header with `scope = []`.
fn path_route(path: &str) -> String {
    format!(
        "{BASE}[[routes]]\nname = \"payments\"\nmethods = [\"POST\"]\npath = '{path}'\n\
         key = {{ header = \"Idempotency-Key\" }}\nscope = []\n"
    )
}

/// A path written in another framework's syntax matches no request, so dedupe would be
/// off without a word: it is refused at load, naming the route and the field, with what
/// this gateway's patterns mean.
#[test]
fn a_path_in_another_framework_s_syntax_is_refused() {
    for (path, says) in [
        ("/v1/payments/{id}", "path parameter"),
        ("/v1/{account}/payments/**", "path parameter"),
        ("/v1/payments/:id", "path parameter"),
        ("/v1/payments/:id/refunds", "path parameter"),
        ("/v1/payments/.*", "regular expression"),
        ("/v1/payments/.+", "regular expression"),
        ("/v1/payments/\\d+", "regular expression"),
        ("/v1/\\w+/payments", "regular expression"),
        ("/v1/payments/[^/]+", "regular expression"),
        ("/v1/(payments|orders)/**", "regular expression"),
    ] {
        for args in [&[][..], &["--strict"]] {
            let (code, out, err) = check(&path_route(path), args);
            assert_eq!(code, Some(64), "{path} {args:?}: {out}{err}");
            for told in [
                "routes[payments].path: ",
                says,
                "`*` matches any run of characters, slashes included",
                "`P/**` is `P` and everything under it",
                "`{a,b}`",
                "%7B",
            ] {
                assert!(err.contains(told), "{path}: {told:?} not in\n{err}");
            }
        }
    }
    // The pattern to write instead, where there is one.
    let (_, _, err) = check(&path_route("/v1/payments/{id}/refunds"), &[]);
    assert!(err.contains("\"/v1/payments/*/refunds\""), "{err}");
    let (_, _, err) = check(&path_route("/v1/payments/:id"), &[]);
    assert!(err.contains("\"/v1/payments/*\""), "{err}");
}

/// This gateway's own patterns still load, the glob alternation among them.
#[test]
fn glob_patterns_and_escaped_braces_still_load() {
    for path in [
        "/v1/{orders,payments}/**",
        "/v1/{orders,payments}/*/refunds",
        "/v1/payments/*",
        "/v1/pay?ents/**",
        "/v1/[ab]/*",
        "/v1/[!a]/*",
        "/v1/payments/x:cancel",
        "/v1/payments.json",
        "/v1/%7Bid%7D",
    ] {
        let (code, out, err) = check(&path_route(path), &["--strict"]);
        assert_eq!(code, Some(0), "{path}: {out}{err}");
    }
}

/// Durations take exactly the documented units; `10sec`, `10min` and `10mins` are refused
/// naming the field rather than guessed at.
#[test]
fn durations_outside_the_documented_units_are_refused() {
    for v in [
        "10sec", "10min", "10mins", "10secs", "1hr", "2days", "1week", "5nsec",
    ] {
        let text = format!("{BASE}[defaults]\nlease = \"{v}\"\n");
        let (code, _, err) = check(&text, &[]);
        assert_eq!(code, Some(64), "{v}: {err}");
        assert!(err.contains("defaults.lease: "), "{v}: {err}");
        assert!(
            err.contains(&format!("{v:?} is not a duration")),
            "{v}: {err}"
        );
        let route =
            path_route("/p").replace("scope = []", &format!("scope = []\nwindow = \"{v}\""));
        let (code, _, err) = check(&route, &[]);
        assert_eq!(code, Some(64), "{v}: {err}");
        assert!(err.contains("routes[payments].window: "), "{v}: {err}");
    }
    let text = format!("{BASE}[defaults]\nlease = \"1h 30m\"\nwindow = \"250ms\"\n");
    let (code, _, err) = check(&text, &[]);
    assert_eq!(code, Some(0), "{err}");
}

/// `env:` with no name after it says so, rather than "the environment variable  is not set".
#[test]
fn an_env_source_without_a_name_says_the_name_is_empty() {
    let admin = format!("{BASE}[admin]\nlisten = \"127.0.0.1:9100\"\ntoken = \"env:\"\n");
    let key = format!("{BASE}[store]\nencryption_keys = [\"env:\"]\n");
    for (text, field) in [
        (admin, "admin.token: "),
        (key, "store.encryption_keys[0]: "),
    ] {
        let (code, _, err) = check(&text, &[]);
        assert_eq!(code, Some(64), "{err}");
        assert!(err.contains(field), "{err}");
        assert!(err.contains("the variable's name is empty"), "{err}");
        assert!(!err.contains("variable  is"), "{err}");
    }
}

/// A FIFO named as a key or secret file would block `check` and `run` forever waiting for a
/// writer: it is refused at once, as anything else that is not a regular file.
#[test]
fn a_fifo_as_a_key_or_secret_file_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let fifo = fifo.display().to_string();
    let cases = [
        (
            format!("{BASE}[store]\nencryption_keys = [\"file:{fifo}\"]\n"),
            "store.encryption_keys[0]: ",
        ),
        (
            format!("{BASE}[admin]\nlisten = \"127.0.0.1:9100\"\ntoken = \"file:{fifo}\"\n"),
            "admin.token: ",
        ),
        (
            format!(
                "{BASE}[[routes]]\nname = \"gh\"\nmethods = [\"POST\"]\npath = \"/gh\"\n\
                 preset = \"github\"\nverify = {{ secrets = [\"file:{fifo}\"] }}\n"
            ),
            "routes[gh].verify.secrets",
        ),
        (
            format!("{BASE}[server.tls]\ncert_file = \"{fifo}\"\nkey_file = \"{fifo}\"\n"),
            "server.tls.cert_file",
        ),
    ];
    for (text, field) in cases {
        let (code, err) = check_within(&text, &[]);
        assert_eq!(code, Some(64), "{err}");
        assert!(err.contains(field), "{field:?} not in {err}");
        assert!(err.contains("not a regular file"), "{err}");
    }
}

/// A header key without a scope is one key space for every caller, so one caller's key
/// replays another's response: refused unless `scope = []` says "one caller".
#[test]
fn a_header_key_without_a_scope_is_refused_unless_scope_is_written() {
    let header = |rest: &str| {
        format!(
            "{BASE}[[routes]]\nname = \"p\"\nmethods = [\"POST\"]\npath = \"/p\"\n\
             key = {{ header = \"Idempotency-Key\" }}\n{rest}\n"
        )
    };
    let (code, out, err) = check(&header(""), &[]);
    assert_eq!(code, Some(64), "{out}{err}");
    for told in [
        "routes[p].scope: ",
        "shared by every caller",
        "scope = [\"header:Authorization\"]",
        "scope = []",
    ] {
        assert!(err.contains(told), "{told:?} not in\n{err}");
    }
    for rest in ["scope = []", "scope = [\"header:Authorization\"]"] {
        let (code, out, err) = check(&header(rest), &["--strict"]);
        assert_eq!(code, Some(0), "{rest}: {out}{err}");
    }
    // A webhook preset's sender is one provider, and its key one the provider mints.
    for preset in ["standard-webhooks", "shopify", "github", "stripe"] {
        let text = format!(
            "{BASE}[[routes]]\nname = \"w\"\nmethods = [\"POST\"]\npath = \"/w\"\npreset = \"{preset}\"\n"
        );
        // (Not --strict: a preset without `verify` is warned about, for another reason.)
        let (code, out, err) = check(&text, &[]);
        assert_eq!(code, Some(0), "{preset}: {out}{err}");
        assert!(!out.contains(".scope"), "{preset}: {out}");
        let own_key = text.replace("preset =", "key = { header = \"X-Event-Id\" }\npreset =");
        let (code, out, err) = check(&own_key, &[]);
        assert_eq!(
            code,
            Some(0),
            "{preset} with its own header key: {out}{err}"
        );
    }
}

/// Issue #57, item 7: `check --store` dials the configured store and reports what it is
/// and what `drill`'s store checks find; an unreachable store does not pass.
#[test]
fn check_store_reaches_the_store_and_refuses_an_evicting_or_unreachable_one() {
    let redis = dedupe_test_support::RedisServer::start();
    let on = |url: &str| format!("{BASE}[store]\nbackend = \"redis\"\nurl = \"{url}\"\n");
    let (code, out, err) = check(&on(&redis.url()), &["--store"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("store (redis): reached"), "{out}");
    assert!(out.contains("; SET ... IFEQ: "), "{out}");
    assert!(out.contains(": Redis "), "the server's version: {out}");
    // The same refusal `drill` makes: an evicting policy lets duplicates through.
    let _: () = redis.cmd(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let (code, out, err) = check(&on(&redis.url()), &["--store"]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        out.contains("risk: ") && out.contains("allkeys-lru"),
        "{out}"
    );
    // Nothing listens: it used to pass `check`.
    let port = dedupe_test_support::free_port();
    let (code, out, err) = check(&on(&format!("redis://127.0.0.1:{port}")), &["--store"]);
    assert_eq!(code, Some(69), "{out}\n{err}");
    assert!(out.contains("store (redis): not reached"), "{out}");
    // Without --store, `check` dials nothing.
    let (code, _, _) = check(&on(&format!("redis://127.0.0.1:{port}")), &[]);
    assert_eq!(code, Some(0));
    // The embedded store has nothing to dial and passes.
    let (code, out, err) = check(BASE, &["--store"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("store (memory): reached"), "{out}");
}
