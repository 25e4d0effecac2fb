//! `dedupe-gateway drill`: the real binary, on every shipped configuration (memory and a
//! real redis-server), failing by name on broken setups, and black-box against a running
//! gateway process.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dedupe_test_support::{
    free_port, GatewayConfig, GatewayProcess, GrpcServer, RedisServer, RouteCfg, StoreCfg, Upstream,
};

fn gateway() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"));
    // The shipped files name hosts of their own; the drill never uses their addresses.
    c.env_remove("DEDUPE_REDIS_URL")
        .env_remove("DEDUPE_ADMIN_TOKEN");
    c
}

fn drill(config: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out: Output = gateway()
        .arg("drill")
        .arg("--config")
        .arg(config)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn shipped(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

fn write(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let p = dir.path().join("gateway.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn drill_passes_on_every_shipped_configuration_on_memory_and_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let tmp = tempfile::tempdir().unwrap();
    let mut ran = 0;
    for file in shipped("config").into_iter().chain(shipped("docker")) {
        let text = std::fs::read_to_string(&file).unwrap();
        let on_memory = text.contains("backend = \"memory\"");
        // As shipped: memory files on memory; Redis files on the test's Redis through
        // the same override a container uses, with the admin token its secret gives it.
        let env: &[(&str, &str)] = if on_memory {
            &[]
        } else {
            &[
                ("DEDUPE_REDIS_URL", &url),
                ("DEDUPE_ADMIN_TOKEN", "drill-token"),
            ]
        };
        let (code, out, err) = drill(&file, &["--lease", "1s"], env);
        assert_eq!(code, Some(0), "{}\n{out}\n{err}", file.display());
        assert!(out.contains("all drills passed"), "{out}");
        for d in ["replay", "lease", "crash", "race", "misuse"] {
            assert!(out.contains(&format!("/{d} (")), "{d} missing: {out}");
        }
        if on_memory {
            // And the memory files rewritten onto Redis.
            let rewritten = text.replace(
                "backend = \"memory\"",
                &format!("backend = \"redis\"\nurl = \"{url}\""),
            );
            let copy = write(&tmp, &rewritten);
            let (code, out, err) = drill(&copy, &["--lease", "1s"], &[]);
            assert_eq!(code, Some(0), "{} on redis\n{out}\n{err}", file.display());
            assert!(out.contains("backend=redis"), "{out}");
        }
        ran += 1;
    }
    assert!(ran >= 4, "shipped configurations: {ran}");
    // Nothing of the drill's is left in the store.
    let keys: i64 = redis.cmd(&["DBSIZE"]);
    assert_eq!(keys, 0);
}

#[test]
fn json_report_for_ci() {
    let (code, out, err) = drill(
        Path::new("config/demo.toml"),
        &["--route", "orders", "--format", "json", "--lease", "1s"],
        &[],
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pass"], true);
    assert_eq!(v["setup"]["lease"], "1s");
    let drills = v["drills"].as_array().unwrap();
    assert_eq!(drills.len(), 5, "{out}");
    assert!(drills.iter().all(|d| d["route"] == "orders"));
    let crash = drills.iter().find(|d| d["drill"] == "crash").unwrap();
    assert_eq!(crash["evidence"]["effects"], 2);
    assert!(
        crash["evidence"]["takeover_fence"].as_u64() > crash["evidence"]["first_fence"].as_u64()
    );
    let replay = drills.iter().find(|d| d["drill"] == "replay").unwrap();
    assert_eq!(replay["evidence"]["effects"], 1);
    assert_eq!(replay["evidence"]["byte_identical"], true);
}

fn one_route(route: RouteCfg, store: StoreCfg) -> String {
    GatewayConfig::new("http://127.0.0.1:9")
        .store(store)
        .route(route)
        .to_toml()
}

#[test]
fn a_window_shorter_than_a_retry_fails_the_replay_drill() {
    let tmp = tempfile::tempdir().unwrap();
    let p = write(
        &tmp,
        &one_route(
            RouteCfg::header("orders", "/orders").window("10ms"),
            StoreCfg::memory(),
        ),
    );
    let (code, out, _) = drill(&p, &["--lease", "1s"], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("FAIL orders/replay"), "{out}");
    assert!(out.contains("effects=2"), "{out}");
    assert!(out.contains("FAILED: orders/replay"), "{out}");
}

/// The drills of one route, by name, from a JSON report.
fn drills_by_name(v: &serde_json::Value) -> std::collections::BTreeMap<String, serde_json::Value> {
    v["drills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["drill"].as_str().unwrap().to_owned(), d.clone()))
        .collect()
}

#[test]
fn a_grpc_route_is_drilled_in_grpc_and_passes_on_memory_and_on_redis() {
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let routes = [
        RouteCfg::grpc("pay", "/pay.v1.Payments/Create"),
        // A held outcome and a waiting duplicate: the crash drill checks the hold.
        RouteCfg::grpc("pay", "/pay.v1.Payments/Create")
            .on_unknown_hold()
            .on_conflict_wait("5s"),
    ];
    for store in [StoreCfg::memory(), StoreCfg::redis(redis.url())] {
        for route in routes.clone() {
            let p = write(&tmp, &one_route(route, store.clone()));
            let (code, out, err) = drill(&p, &["--format", "json", "--lease", "1s"], &[]);
            assert_eq!(code, Some(0), "{out}\n{err}");
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["pass"], true, "{out}");
            let d = drills_by_name(&v);
            assert_eq!(d.len(), 5, "{out}");
            for (name, drill) in &d {
                assert_eq!(drill["skipped"], false, "{name}: {drill}");
                assert_eq!(drill["pass"], true, "{name}: {drill}");
            }
            // Counted on the drill's own upstream, which answered in gRPC: one execution
            // per key, the replay the same message and trailers, status OK.
            let replay = &d["replay"]["evidence"];
            assert_eq!(replay["effects"], 1, "{replay}");
            assert_eq!(replay["byte_identical"], true, "{replay}");
            assert_eq!(replay["statuses"][0], "grpc-status 0 OK", "{replay}");
            assert_eq!(d["race"]["evidence"]["effects"], 1, "{out}");
            assert_eq!(d["crash"]["evidence"]["effects"], 2, "{out}");
            let misuse = &d["misuse"]["evidence"];
            assert_eq!(misuse["effects"], 1, "{misuse}");
            assert_eq!(
                misuse["changed_request_status"], "grpc-status 9 FAILED_PRECONDITION",
                "{misuse}"
            );
            let lease = &d["lease"]["evidence"];
            if lease["on_conflict"] == "reject" {
                assert_eq!(
                    lease["duplicate_status"], "grpc-status 10 ABORTED",
                    "{lease}"
                );
            } else {
                assert_eq!(
                    d["crash"]["evidence"]["held_status"],
                    "grpc-status 10 ABORTED"
                );
            }
        }
    }
    let keys: i64 = redis.cmd(&["DBSIZE"]);
    assert_eq!(keys, 0, "the drill left records behind");
}

#[test]
fn a_grpc_route_whose_window_is_shorter_than_a_retry_fails_the_replay_drill() {
    let tmp = tempfile::tempdir().unwrap();
    let p = write(
        &tmp,
        &one_route(
            RouteCfg::grpc("pay", "/pay.v1.Payments/Create").window("10ms"),
            StoreCfg::memory(),
        ),
    );
    let (code, out, _) = drill(&p, &["--lease", "1s", "--route", "pay"], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("FAIL pay/replay"), "{out}");
    assert!(out.contains("effects=2"), "{out}");
    assert!(out.contains("FAILED: pay/replay"), "{out}");
}

#[test]
fn a_grpc_route_whose_calls_reach_the_upstream_over_http1_fails_every_drill() {
    let tmp = tempfile::tempdir().unwrap();
    let text = one_route(
        RouteCfg::grpc("pay", "/pay.v1.Payments/Create"),
        StoreCfg::memory(),
    );
    let off = text.replacen("[server]\n", "[server]\nupstream_http2 = \"off\"\n", 1);
    assert_ne!(off, text);
    let p = write(&tmp, &off);
    let (code, out, err) = drill(&p, &["--lease", "1s"], &[]);
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(out.contains("FAIL pay/replay"), "{out}");
    assert!(out.contains("reached it over HTTP/1.1"), "{out}");
    assert!(!out.contains("PASS pay/"), "{out}");
}

#[test]
fn drills_on_signed_routes_sign_as_the_provider_does_and_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = |name: &str, value: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, value).unwrap();
        format!("file:{}", p.display())
    };
    let mut config = GatewayConfig::new("http://127.0.0.1:9").store(StoreCfg::memory());
    for (preset, value) in [
        ("stripe", "whsec_drill_endpoint_secret"),
        ("github", "drill-secret"),
        ("shopify", "drill-secret"),
        (
            "standard-webhooks",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        ),
    ] {
        let route = RouteCfg::preset(preset, &format!("/hooks/{preset}"), preset)
            .verify(&[secret(preset, value)]);
        config = config.route(route);
    }
    let p = write(&tmp, &config.to_toml());
    let (code, out, err) = drill(&p, &["--lease", "1s"], &[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("all drills passed"), "{out}");
    assert!(!out.contains("SKIP"), "{out}");
}

#[test]
fn an_evicting_redis_fails_the_store_check() {
    let redis = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let tmp = tempfile::tempdir().unwrap();
    let p = write(
        &tmp,
        &one_route(
            RouteCfg::header("orders", "/orders"),
            StoreCfg::redis(redis.url()),
        ),
    );
    let (code, out, _) = drill(&p, &["--lease", "1s"], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("FAIL store redis"), "{out}");
    assert!(out.contains("maxmemory-policy is allkeys-lru"), "{out}");
    assert!(out.contains("FAILED: store"), "{out}");
    // The drills themselves still ran and passed: the store check is what failed.
    assert!(out.contains("PASS orders/replay"), "{out}");
}

/// Redis's default `hash-max-listpack-value` costs memory, not the guarantee: a notice
/// that does not fail the drill, and none at the advised value.
#[test]
fn a_small_listpack_value_is_a_notice_not_a_failure() {
    for (value, notice) in [("64", true), ("1024", false)] {
        let redis = RedisServer::start_with(&["--hash-max-listpack-value", value]);
        let tmp = tempfile::tempdir().unwrap();
        let p = write(
            &tmp,
            &one_route(
                RouteCfg::header("orders", "/orders").scope(&["header:Authorization"]),
                StoreCfg::redis(redis.url()),
            ),
        );
        let (code, out, err) = drill(&p, &["--lease", "1s"], &[]);
        assert_eq!(code, Some(0), "{out}\n{err}");
        assert!(out.contains("all drills passed"), "{out}");
        assert_eq!(
            out.contains("notice [") && out.contains("before Redis 7) is 64"),
            notice,
            "hash-max-listpack-value {value}: {out}"
        );
    }
}

#[test]
fn an_unreachable_store_fails_the_store_check() {
    let tmp = tempfile::tempdir().unwrap();
    let p = write(
        &tmp,
        &one_route(
            RouteCfg::header("orders", "/orders"),
            StoreCfg::redis(format!("redis://127.0.0.1:{}", free_port())),
        ),
    );
    let (code, out, _) = drill(&p, &[], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("the store does not answer"), "{out}");
    assert!(out.contains("FAILED: store"), "{out}");
}

#[test]
fn an_unknown_route_is_a_usage_error() {
    let (code, _, err) = drill(Path::new("config/demo.toml"), &["--route", "nope"], &[]);
    assert_eq!(code, Some(64));
    assert!(err.contains("--route nope"), "{err}");
}

/// A gateway process on Redis with a scoped header route and a fingerprint route.
async fn live_gateway() -> (Upstream, RedisServer, GatewayProcess, GatewayConfig) {
    let upstream = Upstream::start().await;
    let redis = RedisServer::start();
    let cfg = GatewayConfig::new(upstream.url())
        .store(StoreCfg::redis(redis.url()))
        .admin_with_token("s3cret")
        .route(RouteCfg::header("orders", "/orders").scope(&["header:Authorization"]))
        .route(
            RouteCfg::fingerprint("webhooks", "/webhooks/*", &["path", "json:/id"])
                .on_conflict_wait("5s"),
        );
    let gw = GatewayProcess::start(&cfg);
    (upstream, redis, gw, cfg)
}

async fn drill_target(
    cfg: &GatewayConfig,
    gw: &GatewayProcess,
    route: &str,
    yes: bool,
) -> (Option<i32>, String, String) {
    let mut args = vec!["--token", "s3cret"];
    if yes {
        args.push("--yes");
    }
    drill_target_with(cfg, gw, route, &args).await
}

/// `drill --target` on `route` with `extra` arguments (token, headers, --yes).
async fn drill_target_with(
    cfg: &GatewayConfig,
    gw: &GatewayProcess,
    route: &str,
    extra: &[&str],
) -> (Option<i32>, String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let p = write(&tmp, &cfg.to_toml());
    let mut args = vec![
        "--target".to_owned(),
        gw.url(""),
        "--admin".to_owned(),
        gw.admin_url(""),
        "--route".to_owned(),
        route.to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        drill(&p, &args, &[])
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_target_passes_against_a_running_gateway_and_leaves_no_records() {
    let (upstream, redis, gw, cfg) = live_gateway().await;
    // On the fingerprint route the key is what must match (`match` defaults to the
    // fingerprint's parts), so the same key cannot come with a different request: misuse
    // is not applicable there and makes no record.
    for (route, records) in [("orders", 3), ("webhooks", 2)] {
        let (code, out, err) = drill_target(&cfg, &gw, route, true).await;
        assert_eq!(code, Some(0), "{route}\n{out}\n{err}");
        assert!(err.contains("will send these requests"), "{err}");
        for d in ["replay", "race", "misuse"] {
            assert!(out.contains(&format!("PASS {route}/{d}")), "{out}");
        }
        assert!(out.contains("metrics_delta="), "{out}");
        assert!(
            out.contains(&format!(
                "PASS cleanup: {records} record(s) deleted, 0 left"
            )),
            "{out}"
        );
    }
    // The real upstream executed each drill's request once (replay, race, misuse).
    assert_eq!(upstream.effects(), 5);
    let keys: i64 = redis.cmd(&["DBSIZE"]);
    assert_eq!(keys, 0, "the drill left records behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_target_drills_a_grpc_route_of_a_running_gateway_in_front_of_a_grpc_server() {
    // A real gRPC server (grpcio) counts the executions behind a gateway process.
    let server = GrpcServer::start().await;
    let redis = RedisServer::start();
    let cfg = GatewayConfig::new(server.url())
        .store(StoreCfg::redis(redis.url()))
        .admin_with_token("s3cret")
        .route(RouteCfg::grpc("create", "/test.Payments/Create"));
    let gw = GatewayProcess::start(&cfg);
    let (code, out, err) = drill_target(&cfg, &gw, "create", true).await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(err.contains("body (gRPC message): {"), "{err}");
    for d in ["replay", "race", "misuse"] {
        assert!(out.contains(&format!("PASS create/{d}")), "{out}");
    }
    assert!(out.contains("grpc-status 9 FAILED_PRECONDITION"), "{out}");
    assert!(
        out.contains("PASS cleanup: 3 record(s) deleted, 0 left"),
        "{out}"
    );
    // Replay, race and misuse each executed once on the gRPC server.
    assert_eq!(server.executions("Create").await, 3);
    let keys: i64 = redis.cmd(&["DBSIZE"]);
    assert_eq!(keys, 0, "the drill left records behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_target_without_admin_access_sends_nothing() {
    let (upstream, redis, gw, cfg) = live_gateway().await;
    for extra in [&["--token", "wrong", "--yes"][..], &["--yes"]] {
        let (code, out, err) = drill_target_with(&cfg, &gw, "orders", extra).await;
        assert_eq!(code, Some(64), "{extra:?}\n{out}\n{err}");
        assert!(err.contains("401"), "{err}");
        assert!(err.contains("nothing was sent"), "{err}");
    }
    assert_eq!(upstream.effects(), 0, "no request reached the upstream");
    let keys: i64 = redis.cmd(&["DBSIZE"]);
    assert_eq!(keys, 0, "no record was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_target_refuses_a_key_header_and_never_touches_a_real_record() {
    let (upstream, _redis, gw, cfg) = live_gateway().await;
    let http = dedupe_test_support::Http::new();
    let real = [
        ("Idempotency-Key", "real-order-1"),
        ("Authorization", "Bearer real"),
    ];
    let first = http.post(&gw.url("/orders"), &real, "{}").await;
    assert_eq!(first.status, http::StatusCode::CREATED);
    let (code, out, err) = drill_target_with(
        &cfg,
        &gw,
        "orders",
        &[
            "--token",
            "s3cret",
            "--yes",
            "--header",
            "Idempotency-Key: real-order-1",
            "--header",
            "Authorization: Bearer real",
        ],
    )
    .await;
    assert_eq!(code, Some(64), "{out}\n{err}");
    assert!(err.contains("--header idempotency-key"), "{err}");
    // The real client's record is still there: its retry replays, nothing executes again.
    let retry = http.post(&gw.url("/orders"), &real, "{}").await;
    assert!(retry.replayed(), "{}", retry.text());
    assert_eq!(upstream.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill_target_refuses_without_yes_after_printing_the_plan() {
    let (upstream, _redis, gw, cfg) = live_gateway().await;
    let (code, out, err) = drill_target(&cfg, &gw, "orders", false).await;
    assert_eq!(code, Some(64), "{out}\n{err}");
    assert!(err.contains("POST http://"), "{err}");
    assert!(err.contains("idempotency-key: drill-"), "{err}");
    assert!(err.contains("refusing without --yes"), "{err}");
    assert_eq!(upstream.effects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_logs_store_findings_at_start_up() {
    let upstream = Upstream::start().await;
    let redis = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let cfg = GatewayConfig::new(upstream.url())
        .store(StoreCfg::redis(redis.url()))
        .route(RouteCfg::header("orders", "/orders"));
    let gw = GatewayProcess::start(&cfg);
    gw.wait_logged("store check: maxmemory-policy is allkeys-lru")
        .await;
}

/// A route that holds unknown outcomes (`on_unknown = "hold"`, the setting the book
/// advises for payments) passes its crash drill: the dead winner's key answers 409
/// `outcome-unknown` instead of being taken over, and an operator's resolve frees it.
#[test]
fn the_crash_drill_on_a_holding_route_checks_the_hold_and_its_resolve() {
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let route = "[[routes]]\nname = \"pay\"\nmethods = [\"POST\"]\npath = \"/v1/pay/**\"\nkey = { header = \"Idempotency-Key\" }\nscope = []\non_unknown = \"hold\"\n";
    let base = "[server]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9000\"\n";
    for store in [
        "[store]\nbackend = \"memory\"\n".to_owned(),
        format!("[store]\nbackend = \"redis\"\nurl = \"{}\"\n", redis.url()),
    ] {
        let file = write(&tmp, &format!("{base}{store}{route}"));
        let (code, out, err) = drill(&file, &["--lease", "1s"], &[]);
        assert_eq!(code, Some(0), "{store}\n{out}\n{err}");
        assert!(out.contains("PASS pay/crash"), "{out}");
        assert!(out.contains("held_status=409"), "{out}");
        assert!(out.contains("effects_while_held=1"), "{out}");
        assert!(out.contains("resolved=true"), "{out}");
    }
}

#[test]
fn drill_overload_runs_only_on_request_and_refuses_only_before_the_claim() {
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = GatewayConfig::new("http://127.0.0.1:9")
        .store(StoreCfg::redis(redis.url()))
        .route(RouteCfg::header("orders", "/orders/*"));
    let p = write(&tmp, &cfg.to_toml());
    let args = ["--format", "json", "--lease", "1s", "--overload"];
    let (code, out, err) = drill(&p, &args, &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let overload = &drills_by_name(&v)["overload"];
    assert_eq!(overload["pass"], true, "{overload}");
    let evidence = &overload["evidence"];
    assert_eq!(evidence["unstored"], 0, "{evidence}");
    assert_eq!(evidence["refused_after_claim"], 0, "{evidence}");
    assert!(evidence["admitted"].as_u64().unwrap() > 0, "{evidence}");
    assert_eq!(v["cleanup"]["left"], serde_json::json!([]), "{v}");
    // Never by default.
    let (code, out, err) = drill(&p, &["--format", "json", "--lease", "1s"], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(!drills_by_name(&v).contains_key("overload"), "{v}");
}

#[test]
fn drill_overload_is_refused_with_a_target() {
    let args = [
        "--overload",
        "--target",
        "http://127.0.0.1:9",
        "--admin",
        "http://127.0.0.1:9",
    ];
    let (code, _, err) = drill(Path::new("config/demo.toml"), &args, &[]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--overload"), "{err}");
}
