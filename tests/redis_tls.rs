//! TLS to Redis (`rediss://`): real redis-servers serving TLS with certificates the test
//! makes; claims, replays and readiness through them; a wrong CA, a missing client
//! certificate and a wrong password refused with clear errors that never show the secret.

use std::time::Duration;

use dedupe_test_support::{
    eventually, GatewayConfig, GatewayProcess, Http, RedisServer, RedisTls, RouteCfg, StoreCfg,
    TestCa, Upstream,
};
use http::StatusCode;

/// A CA and a redis-server serving TLS with a certificate it signed.
fn tls_redis(require_client_cert: bool) -> (TestCa, RedisServer) {
    let ca = TestCa::new("redis");
    let tls = RedisTls {
        server: ca.issue("redis-server"),
        ca_file: ca.ca_file.clone(),
        require_client_cert,
    };
    let redis = RedisServer::start_tls(&tls, &[]);
    (ca, redis)
}

fn config(up: &Upstream, store: StoreCfg) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .store(store.timeout("1s"))
        .admin()
        .route(RouteCfg::header("orders", "/orders/*"))
}

async fn readyz(http: &Http, gw: &GatewayProcess) -> StatusCode {
    http.get(&gw.admin_url("/readyz"), &[]).await.status
}

/// A won claim, its replay, one effect upstream, and the record in Redis.
async fn dedupes(http: &Http, gw: &GatewayProcess, up: &Upstream, key: &str) {
    let url = gw.url(&format!("/orders/{key}"));
    let first = http.post(&url, &[("Idempotency-Key", key)], "{}").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    let second = http.post(&url, &[("Idempotency-Key", key)], "{}").await;
    assert_eq!(second.status, StatusCode::CREATED, "{}", second.text());
    assert!(second.replayed(), "{second:?}");
    assert_eq!(second.body, first.body);
    assert_eq!(up.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_replays_and_readiness_go_over_tls() {
    let (ca, redis) = tls_redis(false);
    let up = Upstream::start().await;
    let store = StoreCfg::redis(redis.tls_url()).tls_ca_file(&ca.ca_file);
    let gw = GatewayProcess::start(&config(&up, store));
    let http = Http::new();
    assert!(
        eventually(Duration::from_secs(5), || async {
            readyz(&http, &gw).await == StatusCode::OK
        })
        .await
    );
    dedupes(&http, &gw, &up, "tls-1").await;
    // The record went through the TLS port into this server.
    let keys: Vec<String> = redis.cmd(&["KEYS", "dedupe*"]);
    assert_eq!(keys.len(), 1, "{keys:?}");
    // And that port speaks nothing but TLS: the gateway did not fall back to plaintext.
    let plain = redis::Client::open(format!("redis://127.0.0.1:{}", redis.tls_port.unwrap()))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(1))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
    assert!(plain.is_err(), "the TLS port answered plaintext: {plain:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_another_ca_is_refused() {
    let (_ca, redis) = tls_redis(false);
    let other = TestCa::new("other");
    let up = Upstream::start().await;
    let store = StoreCfg::redis(redis.tls_url()).tls_ca_file(&other.ca_file);
    let gw = GatewayProcess::start(&config(&up, store));
    let http = Http::new();
    gw.wait_logged("cannot reach Redis").await;
    let lines = gw.log_lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("cannot reach Redis") && l.contains("UnknownIssuer")),
        "no log line says the certificate's issuer is unknown: {lines:#?}"
    );
    assert_eq!(readyz(&http, &gw).await, StatusCode::SERVICE_UNAVAILABLE);
    let r = http
        .post(&gw.url("/orders/a"), &[("Idempotency-Key", "a")], "{}")
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(up.effects(), 0, "fail-closed: nothing forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let (ca, redis) = tls_redis(true);
    let up = Upstream::start().await;
    let http = Http::new();

    // Without a client certificate Redis ends the handshake: not ready.
    let without = GatewayProcess::start(&config(
        &up,
        StoreCfg::redis(redis.tls_url()).tls_ca_file(&ca.ca_file),
    ));
    without.wait_logged("cannot reach Redis").await;
    assert_eq!(
        readyz(&http, &without).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    drop(without);

    let client = ca.issue("gateway-client");
    let with = GatewayProcess::start(&config(
        &up,
        StoreCfg::redis(redis.tls_url())
            .tls_ca_file(&ca.ca_file)
            .tls_client_cert(&client),
    ));
    assert!(
        eventually(Duration::from_secs(5), || async {
            readyz(&http, &with).await == StatusCode::OK
        })
        .await
    );
    dedupes(&http, &with, &up, "mtls-1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_authenticates_from_the_url_or_the_environment() {
    let (ca, redis) = tls_redis(false);
    let _: String = redis.cmd(&["ACL", "SETUSER", "app", "on", ">s3cret-pw", "~*", "+@all"]);
    // The default user is switched off: nothing gets in without the ACL user.
    let _: String = redis.cmd(&["ACL", "SETUSER", "default", "off"]);
    let port = redis.tls_port.unwrap();
    let up = Upstream::start().await;
    let http = Http::new();

    // A wrong password: not ready, and the log says why without printing it.
    let wrong = GatewayProcess::start(&config(
        &up,
        StoreCfg::redis(format!("rediss://app:wrong-pw@127.0.0.1:{port}")).tls_ca_file(&ca.ca_file),
    ));
    wrong.wait_logged("cannot reach Redis").await;
    assert_eq!(readyz(&http, &wrong).await, StatusCode::SERVICE_UNAVAILABLE);
    wrong.assert_logged_without("Password authentication failed", "wrong-pw");
    drop(wrong);

    // The password in the URL.
    let in_url = GatewayProcess::start(&config(
        &up,
        StoreCfg::redis(format!("rediss://app:s3cret-pw@127.0.0.1:{port}/0"))
            .tls_ca_file(&ca.ca_file),
    ));
    assert!(
        eventually(Duration::from_secs(5), || async {
            readyz(&http, &in_url).await == StatusCode::OK
        })
        .await
    );
    dedupes(&http, &in_url, &up, "acl-1").await;
    assert!(!in_url.log_lines().iter().any(|l| l.contains("s3cret-pw")));
    drop(in_url);

    // The user in the URL, the password from DEDUPE_REDIS_PASSWORD: the same record.
    let from_env = GatewayProcess::start_with_env(
        &config(
            &up,
            StoreCfg::redis(format!("rediss://app@127.0.0.1:{port}/0")).tls_ca_file(&ca.ca_file),
        ),
        &[("DEDUPE_REDIS_PASSWORD", "s3cret-pw")],
    );
    let url = from_env.url("/orders/acl-1");
    let r = http.post(&url, &[("Idempotency-Key", "acl-1")], "{}").await;
    assert!(r.replayed(), "{r:?}");
    assert_eq!(up.effects(), 1);
    assert!(!from_env.log_lines().iter().any(|l| l.contains("s3cret-pw")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_insecure_connects_without_a_ca_and_warns() {
    let (_ca, redis) = tls_redis(false);
    let up = Upstream::start().await;
    let gw = GatewayProcess::start(&config(
        &up,
        StoreCfg::redis(redis.tls_url()).tls_insecure(true),
    ));
    gw.wait_logged("store.tls_insecure = true").await;
    let http = Http::new();
    assert!(
        eventually(Duration::from_secs(5), || async {
            readyz(&http, &gw).await == StatusCode::OK
        })
        .await
    );
    dedupes(&http, &gw, &up, "insecure-1").await;
}
