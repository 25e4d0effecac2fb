//! The binary's command line: `check` and `run` refuse invalid files with exit 64 and a
//! message naming the route and field, before any port is bound.

use std::process::Command;

use dedupe_test_support::{GatewayConfig, RouteCfg, StoreCfg};

fn gateway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
}

fn write(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
    let p = dir.path().join("gateway.toml");
    std::fs::write(&p, text).unwrap();
    p
}

const BASE: &str = "[server]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\n";

/// A file with one header-key route named `payments`, plus `extra` inside that route: the
/// literal text whose handling the tests check.
fn payments_route(extra: &str) -> String {
    format!("{BASE}[[routes]]\nname = \"payments\"\nmethods = [\"POST\"]\npath = \"/p\"\nkey = {{ header = \"Idempotency-Key\" }}\nscope = []\n{extra}")
}

/// Runs `check` on `text`; returns the exit code, stdout and stderr.
fn check(text: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = write(&dir, text);
    let out = gateway()
        .arg("check")
        .arg("--config")
        .arg(&p)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_prints_the_routes_it_understood() {
    let out = gateway()
        .args(["check", "--config", "config/example.toml"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("route payments: POST,PATCH /v1/payments/** key=header idempotency-key (required) lease=10s window=1d"), "{text}");
    assert!(
        text.contains("scope=[header:authorization] match=request on_unknown=retry mode=enforce\n"),
        "check shows what decides a request's fate on every route: {text}"
    );
    assert!(text.contains("route shopify-orders:"), "{text}");
    assert!(text.contains("window=3d"), "{text}");
    assert!(
        text.contains(
            "fingerprint [method, path, json:/order_id, json:/event_type, header:x-source]"
        ),
        "{text}"
    );
}

#[test]
fn every_shipped_config_passes_check() {
    for entry in std::fs::read_dir("config")
        .unwrap()
        .chain(std::fs::read_dir("docker").unwrap())
    {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            // The deployment files take the admin token from a secret, as a container
            // gets it.
            let out = gateway()
                .arg("check")
                .arg("--config")
                .arg(&path)
                .env("DEDUPE_ADMIN_TOKEN", "from-a-secret")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(!stdout.contains("warning:"), "{}: {stdout}", path.display());
        }
    }
}

#[test]
fn no_shipped_file_serves_the_admin_api_without_a_token() {
    let mut beyond_loopback = 0;
    for entry in std::fs::read_dir("config")
        .unwrap()
        .chain(std::fs::read_dir("docker").unwrap())
    {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        if !text.contains("listen = \"0.0.0.0:9901\"") {
            continue;
        }
        beyond_loopback += 1;
        // Without the secret the file names, the gateway refuses to start.
        let out = gateway()
            .args(["run", "--config"])
            .arg(&path)
            .env_remove("DEDUPE_ADMIN_TOKEN")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{}: {err}", path.display());
        assert!(err.contains("admin.token"), "{}: {err}", path.display());
    }
    assert_eq!(
        beyond_loopback, 2,
        "docker/gateway.toml and kubernetes-gateway.toml"
    );
    // The deployment files hand it over from a secret, and compose publishes the admin port
    // on the host's loopback only.
    let compose = std::fs::read_to_string("docker/compose.yaml").unwrap();
    assert!(
        compose.contains("DEDUPE_ADMIN_TOKEN: ${DEDUPE_ADMIN_TOKEN:?"),
        "compose must require the token"
    );
    assert!(compose.contains("\"127.0.0.1:9901:9901\""));
    let kubernetes = std::fs::read_to_string("docker/kubernetes.yaml").unwrap();
    let env = kubernetes
        .split("- name: DEDUPE_ADMIN_TOKEN")
        .nth(1)
        .expect("the gateway container sets DEDUPE_ADMIN_TOKEN");
    assert!(
        env.trim_start().starts_with(
            "valueFrom:\n                secretKeyRef: {name: dedupe-gateway-admin, key: token}"
        ),
        "{env}"
    );
}

#[test]
fn check_rejects_an_unknown_field_with_exit_64() {
    let (code, _, err) = check(&payments_route("windw = \"1h\"\n"));
    assert_eq!(code, Some(64));
    assert!(
        err.contains("routes[payments]: unknown field `windw`"),
        "{err}"
    );
    assert_eq!(err.matches("windw").count(), 1, "said once: {err}");
}

#[test]
fn check_rejects_a_bad_duration_naming_route_and_field() {
    let (code, _, err) = check(&payments_route("lease = \"30 parsecs\"\n"));
    assert_eq!(code, Some(64));
    assert!(err.contains("routes[payments].lease"), "{err}");
}

#[test]
fn run_refuses_an_invalid_file_before_binding_and_reads_dedupe_config() {
    let dir = tempfile::tempdir().unwrap();
    // A port that is busy: if run bound before validating, it would fail differently.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    let p = write(
        &dir,
        &format!("[server]\nlisten = \"{addr}\"\nupstream = \"http://127.0.0.1:9\"\n[defaults]\nwindow = \"forever\"\n"),
    );
    let out = gateway()
        .arg("run")
        .env("DEDUPE_CONFIG", &p)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("defaults.window"), "{err}");
}

#[test]
fn the_kubernetes_config_map_carries_the_checked_config() {
    let yaml = std::fs::read_to_string("docker/kubernetes.yaml").unwrap();
    let toml = std::fs::read_to_string("docker/kubernetes-gateway.toml").unwrap();
    let mut lines = yaml
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("gateway.toml: |"));
    lines.next().expect("no gateway.toml in the ConfigMap");
    let embedded: Vec<&str> = lines
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| l.strip_prefix("    ").unwrap_or(""))
        .collect();
    let embedded = embedded.join("\n");
    assert_eq!(
        embedded.trim_end(),
        toml.trim_end(),
        "docker/kubernetes.yaml and docker/kubernetes-gateway.toml differ"
    );
}

#[test]
fn check_warns_when_a_lease_is_too_short_to_renew() {
    // A renewed lease need not outlast the upstream timeout ...
    let config = GatewayConfig::new("http://127.0.0.1:9")
        .upstream_timeout("30s")
        .route(RouteCfg::header("payments", "/p").lease("10s"));
    let (code, out, _) = check(&config.to_toml());
    assert_eq!(code, Some(0));
    assert!(!out.contains("warning: routes[payments].lease"), "{out}");
    // ... but must leave room for a renewal every third of it (Redis's store.timeout,
    // 250ms) ...
    let config = GatewayConfig::new("http://127.0.0.1:9")
        .store(StoreCfg::redis("redis://127.0.0.1:6379"))
        .route(RouteCfg::header("payments", "/p").lease("1s"));
    let (code, out, _) = check(&config.to_toml());
    assert_eq!(code, Some(0));
    assert!(out.contains("warning: routes[payments].lease"), "{out}");
    // ... which the embedded store, never waiting, has no use for.
    let config = GatewayConfig::new("http://127.0.0.1:9")
        .store(StoreCfg::memory())
        .route(RouteCfg::header("payments", "/p").lease("1s"));
    let (code, out, _) = check(&config.to_toml());
    assert_eq!(code, Some(0));
    assert!(!out.contains("warning: routes[payments].lease"), "{out}");
}

/// Values that once passed `check` and then panicked at run time (or in `check` itself):
/// every one is now refused with exit 64 and the field's name.
#[test]
fn check_refuses_out_of_range_numbers_naming_the_field() {
    let huge = [
        "500000000000y",
        "500000000000d",
        "18446744073709551615s 999999999ns 1ns",
    ];
    let server =
        |field: &str, v: &str| BASE.replace("[server]\n", &format!("[server]\n{field} = {v}\n"));
    let mut cases: Vec<(String, String)> = Vec::new();
    for v in huge {
        let q = format!("{v:?}");
        for field in ["lease", "window", "conflict_wait"] {
            cases.push((
                payments_route(&format!("{field} = {q}\n")),
                format!("routes[payments].{field}"),
            ));
            cases.push((
                format!("{BASE}[defaults]\n{field} = {q}\n"),
                format!("defaults.{field}"),
            ));
        }
        for field in [
            "upstream_timeout",
            "header_read_timeout",
            "shutdown_grace",
            "connect_timeout",
            "body_read_timeout",
        ] {
            cases.push((server(field, &q), format!("server.{field}")));
        }
        cases.push((
            format!("{BASE}[store]\ntimeout = {q}\n"),
            "store.timeout".into(),
        ));
    }
    cases.push((
        server("max_connections", "9223372036854775807"),
        "server.max_connections".into(),
    ));
    cases.push((
        server("max_connections", "1000001"),
        "server.max_connections".into(),
    ));
    cases.push((
        server("max_concurrent_streams", "4294967295"),
        "server.max_concurrent_streams".into(),
    ));
    cases.push((server("max_body", "\"16EiB\""), "server.max_body".into()));
    // Units the configuration reference does not document are refused, never guessed at.
    for unit in ["\"1Mb\"", "\"1M\"", "\"1 MiB\"", "\"1MB\""] {
        cases.push((server("max_body", unit), "server.max_body".into()));
    }
    cases.push((
        payments_route("max_cached_body = \"1TiB\"\n"),
        "routes[payments].max_cached_body".into(),
    ));
    cases.push((
        format!("{BASE}[store]\nmax_records = 9223372036854775807\n"),
        "store.max_records".into(),
    ));
    cases.push((
        format!("{BASE}[store]\nprefix = \"{}\"\n", "p".repeat(70_000)),
        "store.prefix".into(),
    ));
    cases.push((
        format!("{BASE}[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nrecord_layout = \"string\"\n"),
        "store.record_layout".into(),
    ));
    for (text, field) in cases {
        let (code, _, err) = check(&text);
        assert_eq!(code, Some(64), "{field}: {err}");
        assert!(err.contains(&format!("{field}:")), "{field}: {err}");
        assert!(!err.contains("panicked"), "{field}: {err}");
    }
}

#[test]
fn check_refuses_a_worker_count_out_of_range_naming_the_field() {
    // No workers at all, more threads than the bound, or a count that is not a number.
    for v in ["0", "1025", "-1", "\"auto\"", "1.5"] {
        let text = BASE.replace("[server]\n", &format!("[server]\nworkers = {v}\n"));
        let (code, _, err) = check(&text);
        assert_eq!(code, Some(64), "{v}: {err}");
        assert!(err.contains("server.workers"), "{v}: {err}");
        assert!(!err.contains("panicked"), "{v}: {err}");
    }
}

#[test]
fn check_accepts_the_largest_values_in_bounds() {
    let text = payments_route("lease = \"1d\"\nwindow = \"365d\"\nconflict_wait = \"1h\"\n")
        .replace(
        "[server]\n",
        "[server]\nupstream_timeout = \"1h\"\nshutdown_grace = \"1h\"\nmax_connections = 1000000\nworkers = 1024\n",
    ) + "[store]\nprefix = \""
        + &"p".repeat(256)
        + "\"\ntimeout = \"1m\"\n";
    let (code, out, err) = check(&text);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("lease=1d window=365d"), "{out}");
}

/// `check ... | head -2`: a reader that closes the pipe early ends the output quietly.
#[test]
fn check_ends_quietly_when_stdout_is_closed() {
    let (reader, writer) = std::io::pipe().unwrap();
    // Closed before the gateway writes a byte, so every write meets a broken pipe.
    drop(reader);
    let out = gateway()
        .args(["check", "--config", "config/example.toml"])
        .stdout(writer)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "{err}");
}

/// A value of the wrong type is named by its field and described in the words of the
/// configuration reference (docs/configuration.md): no serde type names, no Rust types, no
/// parser internals.
#[test]
fn check_names_the_field_of_a_mistyped_value() {
    let cases = [
        (
            payments_route("lease = 5\n"),
            "routes[payments].lease: expected a duration like \"30s\"",
        ),
        (
            BASE.replace("listen = \"127.0.0.1:0\"", "listen = 8080"),
            "server.listen: expected a string",
        ),
        (
            payments_route("on_error = 5\n"),
            "routes[payments].on_error: expected \"fail-closed\" or \"fail-open\"",
        ),
        (
            payments_route("").replace(
                "key = { header = \"Idempotency-Key\" }",
                "key = \"Idempotency-Key\"",
            ),
            "routes[payments].key: expected a table like { header = \"Idempotency-Key\" }",
        ),
        (
            format!("{BASE}[store]\nmax_records = -1\n"),
            "store.max_records: expected a whole number",
        ),
        (
            BASE.replace("[server]\n", "[server]\nmax_body = \"\"\n"),
            "server.max_body: \"\" is not a size like",
        ),
        (
            format!("bogus = 1\n{BASE}"),
            "configuration: unknown field `bogus`",
        ),
    ];
    for (text, expected) in cases {
        let (code, _, err) = check(&text);
        assert_eq!(code, Some(64), "{err}");
        assert!(err.contains(expected), "wanted {expected:?} in: {err}");
        for internal in [
            "invalid type",
            "File",
            "usize",
            "cannot parse",
            "struct",
            "wanted",
        ] {
            assert!(!err.contains(internal), "{internal:?} in: {err}");
        }
    }
}

#[test]
fn check_refuses_unknown_and_lowercase_methods_unless_the_route_opts_in() {
    let with_methods = |methods: &str, extra: &str| {
        payments_route(extra).replace("methods = [\"POST\"]", &format!("methods = {methods}"))
    };
    let (code, _, err) = check(&with_methods("[\"PSOT\"]", ""));
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("routes[payments].methods: \"PSOT\" is not a standard HTTP method"),
        "{err}"
    );
    assert!(err.contains("allow_extension_methods"), "{err}");

    let (code, _, err) = check(&with_methods("[\"post\"]", ""));
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("routes[payments].methods: \"post\""), "{err}");
    assert!(err.contains("uppercase"), "{err}");

    let (code, _, err) = check(&with_methods(
        "[\"PO ST\"]",
        "allow_extension_methods = true\n",
    ));
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("\"PO ST\" is not an HTTP method"), "{err}");

    let (code, out, err) = check(&with_methods(
        "[\"PROPFIND\", \"MKCOL\", \"PATCH\"]",
        "allow_extension_methods = true\n",
    ));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("route payments: PROPFIND,MKCOL,PATCH /p"),
        "{out}"
    );
}

/// A bad value from a `DEDUPE_*` variable names the variable, not the file.
#[test]
fn an_environment_error_names_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(&dir, BASE);
    for (var, value, field) in [
        ("DEDUPE_LISTEN", "nope", "server.listen"),
        ("DEDUPE_UPSTREAM", "ftp://app:1", "server.upstream"),
        ("DEDUPE_REDIS_URL", "redis://127.0.0.1:6379", "store.url"),
        ("DEDUPE_ADMIN_LISTEN", "127.0.0.1", "admin.listen"),
    ] {
        let out = gateway()
            .arg("check")
            .arg("--config")
            .arg(&p)
            .env(var, value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{var}: {err}");
        assert!(
            err.contains(&format!("invalid environment: {var}: ")),
            "{err}"
        );
        assert!(err.contains(&format!("(it sets {field})")), "{err}");
        assert!(!err.contains("gateway.toml"), "names the file: {err}");
    }
}

/// `check` reads every encryption key, names them by id only, and refuses bad material
/// with exit 64 naming the entry, without ever printing a byte of it.
#[test]
fn check_validates_encryption_keys_without_showing_them() {
    let dir = tempfile::tempdir().unwrap();
    let file_key = "c3".repeat(32);
    let env_key = "d4".repeat(32);
    let key_path = dir.path().join("k2");
    std::fs::write(&key_path, &file_key).unwrap();
    let text = format!(
        "{BASE}[store]\nencryption_keys = [\"file:{}\", \"env:DEDUPE_TEST_KEY_1\"]\n",
        key_path.display()
    );
    let config = write(&dir, &text);
    let out = gateway()
        .args(["check", "--config"])
        .arg(&config)
        .env("DEDUPE_TEST_KEY_1", &env_key)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stdout.contains("stored responses encrypted: key id "),
        "{stdout}"
    );
    assert!(stdout.contains("also decrypting key ids "), "{stdout}");
    for shown in [&stdout, &stderr] {
        assert!(
            !shown.contains("c3c3") && !shown.contains("d4d4"),
            "{shown}"
        );
    }

    // A key that is not 32 bytes: exit 64, the entry named, the material not shown.
    let out = gateway()
        .args(["check", "--config"])
        .arg(&config)
        .env("DEDUPE_TEST_KEY_1", "d4d4d4d4d4d4d4d4")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("store.encryption_keys[1]"), "{stderr}");
    assert!(stderr.contains("DEDUPE_TEST_KEY_1"), "{stderr}");
    assert!(!stderr.contains("d4d4"), "{stderr}");
}

#[test]
fn help_never_prints_the_admin_token_from_the_environment() {
    for args in [
        &["keys", "list", "--help"][..],
        &["keys", "resolve", "--help"],
        &["drill", "--help"],
    ] {
        let out = gateway()
            .args(args)
            .env("DEDUPE_ADMIN_TOKEN", "tok-3f9a-not-for-eyes")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("DEDUPE_ADMIN_TOKEN"), "{args:?}: {text}");
        assert!(
            !text.contains("tok-3f9a-not-for-eyes"),
            "{args:?} printed the token"
        );
    }
}

/// The `Usage:` line of a clap answer.
fn usage_line(text: &str) -> String {
    let line = text.lines().find(|l| l.starts_with("Usage: "));
    line.unwrap_or_else(|| panic!("no usage line in {text}"))
        .to_owned()
}

#[test]
fn a_usage_line_marks_only_required_arguments_as_required() {
    // Each command line leaves out an argument it needs, and gives optional ones, some
    // from the environment: the usage line printed with the error is the one `--help`
    // shows, never the optional arguments bare (`--token <TOKEN>` from DEDUPE_ADMIN_TOKEN).
    let admin = "http://127.0.0.1:9";
    let cases: [(&[&str], &[&str]); 4] = [
        (&["keys", "list"], &["--admin", admin, "--format", "json"]),
        (
            &["keys", "resolve"],
            &["--route", "r", "--admin", admin, "--as", "retry", "--force"],
        ),
        (&["check"], &["--strict", "--body", "x"]),
        (&["drill"], &["--race", "3", "--yes"]),
    ];
    for (command, args) in cases {
        let out = gateway()
            .args(command)
            .args(args)
            .env("DEDUPE_ADMIN_TOKEN", "tok")
            .env("DEDUPE_CONFIG", "config/example.toml")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{command:?}: {stderr}");
        let usage = usage_line(&stderr);
        let help = gateway().args(command).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        assert_eq!(usage, usage_line(&help), "{command:?}");
        for optional in [
            "--token", "--format", "--force", "--strict", "--race", "--yes",
        ] {
            assert!(!usage.contains(optional), "{command:?}: {usage}");
        }
    }
    let list = gateway().args(["keys", "list", "--help"]).output().unwrap();
    assert_eq!(
        usage_line(&String::from_utf8_lossy(&list.stdout)),
        "Usage: dedupe-gateway keys list [OPTIONS] --state <STATE> --admin <ADMIN>"
    );
}
