//! The binary's command line: `check` and `run` refuse invalid files with exit 64 and a
//! message naming the route and field, before any port is bound.

use std::process::Command;

use dedupe_test_support::{GatewayConfig, RouteCfg};

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
    format!("{BASE}[[routes]]\nname = \"payments\"\nmethods = [\"POST\"]\npath = \"/p\"\nkey = {{ header = \"Idempotency-Key\" }}\n{extra}")
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
    assert!(text.contains("route payments: POST,PATCH /v1/payments/* key=header idempotency-key (required) lease=30s window=1day"), "{text}");
    assert!(text.contains("route shopify-orders:"), "{text}");
    assert!(text.contains("window=3days"), "{text}");
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
            let out = gateway()
                .arg("check")
                .arg("--config")
                .arg(&path)
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
fn check_warns_when_a_lease_is_shorter_than_the_upstream_timeout() {
    let config = GatewayConfig::new("http://127.0.0.1:9")
        .upstream_timeout("30s")
        .route(RouteCfg::header("payments", "/p").lease("30s"));
    let (code, out, _) = check(&config.to_toml());
    assert_eq!(code, Some(0));
    assert!(out.contains("warning: routes[payments].lease"), "{out}");
}
