//! What is stored and what is replayed: encryption at rest, routes that keep no body, the
//! replay header policy and `Idempotency-Expires`, on the embedded store and on a real
//! redis-server, counted at a real upstream.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use dedupe_gateway::protocol::key::{self, RequestView};
use dedupe_gateway::store::{Claim, ClaimRequest, Claimants, Completion, Store, StoreKey};
use dedupe_test_support::on_every_store;
use dedupe_test_support::{
    Backend, GatewayConfig, Http, RedisServer, Reply, RouteCfg, StoreCfg, TestGateway, Upstream,
};
use http::{HeaderMap, Method, StatusCode};

on_every_store!(
    encrypted_records_are_unreadable_in_the_store_and_replay,
    a_rotated_gateway_replays_old_records_and_a_wrong_key_fails_closed,
    a_record_moved_under_another_key_does_not_open,
    a_route_that_keeps_no_body_replays_the_status_only,
    replay_drop_headers_removes_headers_from_replays_only,
    idempotency_expires_on_won_and_replayed_answers_unless_turned_off,
);

const WINDOW: Duration = Duration::from_secs(3600);

fn routes(c: GatewayConfig) -> GatewayConfig {
    c.default_lease("5s")
        .default_window("1h")
        .route(RouteCfg::header("enc", "/enc/*"))
        .route(RouteCfg::header("secret", "/secret/*").store_body(false))
        .route(
            RouteCfg::header("dropping", "/dropping/*")
                .replay_drop_headers(&["X-Request-Id", "x-ratelimit-*"]),
        )
        .route(RouteCfg::header("quiet", "/quiet/*").advertise_expiry(false))
}

/// Key files in a directory of the test's own.
struct Keys {
    dir: tempfile::TempDir,
}

impl Keys {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// `file:PATH` of a key whose 32 bytes are all `byte`, written as hex.
    fn source(&self, byte: u8) -> String {
        let path: PathBuf = self.dir.path().join(format!("key-{byte}"));
        std::fs::write(&path, hex_key(byte)).unwrap();
        format!("file:{}", path.display())
    }
}

fn hex_key(byte: u8) -> String {
    format!("{byte:02x}").repeat(32)
}

struct Env {
    up: Upstream,
    http: Http,
    store: StoreCfg,
    redis: Option<RedisServer>,
    keys: Keys,
}

impl Env {
    async fn new(b: Backend) -> Self {
        let (store, redis) = b.start_store();
        Self {
            up: Upstream::start().await,
            http: Http::new(),
            store,
            redis,
            keys: Keys::new(),
        }
    }

    fn config(&self, keys: &[u8]) -> GatewayConfig {
        let sources: Vec<String> = keys.iter().map(|k| self.keys.source(*k)).collect();
        routes(GatewayConfig::new(self.up.url()))
            .store(self.store.clone().encryption_keys(&sources))
            .max_body("64KiB")
            .upstream_timeout("5s")
    }

    /// A gateway sealing with `keys[0]`; on the embedded store, on `shared`'s store.
    async fn gateway(&self, keys: &[u8], shared: Option<&TestGateway>) -> TestGateway {
        let config = self.config(keys);
        match (&self.redis, shared) {
            (None, Some(other)) => {
                TestGateway::start_on(&config, other.gateway.store().clone()).await
            }
            _ => TestGateway::start(&config).await,
        }
    }

    /// Every byte the store holds for `key`: the whole Redis hash or string, read with the
    /// test's own connection, or the embedded store's record.
    async fn raw(&self, gw: &TestGateway, key: &StoreKey) -> Vec<u8> {
        match &self.redis {
            Some(r) if r.cmd::<String>(&["TYPE", key.as_str()]) == "string" => {
                r.cmd(&["GET", key.as_str()])
            }
            Some(r) => {
                let fields: HashMap<Vec<u8>, Vec<u8>> = r.cmd(&["HGETALL", key.as_str()]);
                assert!(!fields.is_empty(), "no record under {key}");
                fields
                    .into_iter()
                    .flat_map(|(k, v)| [k, v])
                    .flatten()
                    .collect()
            }
            None => {
                let info = gw.gateway.store().inspect(key).await.unwrap().unwrap();
                info.response.unwrap().to_vec()
            }
        }
    }
}

fn store_key(route: &str, key: &str) -> StoreKey {
    key::store_key("dedupe", route, "-", key)
}

async fn post(http: &Http, gw: &TestGateway, path: &str, key: &str) -> Reply {
    http.post(&gw.url(path), &[("Idempotency-Key", key)], "{}")
        .await
}

/// Whether any 8 consecutive bytes of `needle` appear in `haystack`. Runs of digits are
/// left out: the fence the upstream echoes is also the record's fence field.
fn shares_bytes(haystack: &[u8], needle: &[u8]) -> bool {
    needle
        .windows(8)
        .filter(|w| !w.iter().all(u8::is_ascii_digit))
        .any(|w| haystack.windows(8).any(|h| h == w))
}

async fn encrypted_records_are_unreadable_in_the_store_and_replay(b: Backend) {
    let e = Env::new(b).await;
    let gw = e.gateway(&[1], None).await;
    // The upstream echoes the path in its body: a recognisable secret.
    let path = "/enc/card-tok_4242_4242_secret";
    let first = post(&e.http, &gw, path, "k1").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    assert!(first.body.len() > 16);
    let raw = e.raw(&gw, &store_key("enc", "k1")).await;
    assert!(!raw.is_empty());
    assert!(
        !shares_bytes(&raw, &first.body),
        "the body is readable in the store"
    );
    assert!(!shares_bytes(&raw, b"application/json"), "headers in clear");
    let again = post(&e.http, &gw, path, "k1").await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(again.status, first.status);
    assert_eq!(e.up.effects(), 1);
}

async fn a_rotated_gateway_replays_old_records_and_a_wrong_key_fails_closed(b: Backend) {
    let e = Env::new(b).await;
    let old = e.gateway(&[1], None).await;
    let first = post(&e.http, &old, "/enc/a", "before-rotation").await;
    assert_eq!(first.status, StatusCode::CREATED);

    // Rotation: a new first key, the old one second.
    let rotated = e.gateway(&[2, 1], Some(&old)).await;
    let replay = post(&e.http, &rotated, "/enc/a", "before-rotation").await;
    assert!(replay.replayed(), "{}", replay.text());
    assert_eq!(replay.body, first.body);
    let fresh = post(&e.http, &rotated, "/enc/b", "after-rotation").await;
    assert_eq!(fresh.status, StatusCode::CREATED);
    assert!(!fresh.replayed());
    let again = post(&e.http, &rotated, "/enc/b", "after-rotation").await;
    assert!(again.replayed());
    assert_eq!(e.up.effects(), 2);

    // A gateway without the key a record names answers 503 (the route fails closed) and
    // forwards nothing: neither a replay of unverified bytes nor a second execution.
    let stranger = e.gateway(&[3], Some(&old)).await;
    for (path, key) in [("/enc/a", "before-rotation"), ("/enc/b", "after-rotation")] {
        let r = post(&e.http, &stranger, path, key).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
        assert_eq!(
            r.problem_type(),
            "urn:dedupe-gateway:problem:store-unavailable"
        );
    }
    // The old gateway has only the old key: the record sealed after the rotation does not
    // open there either.
    let r = post(&e.http, &old, "/enc/b", "after-rotation").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(e.up.effects(), 2, "nothing was forwarded");
}

async fn a_record_moved_under_another_key_does_not_open(b: Backend) {
    let e = Env::new(b).await;
    let gw = e.gateway(&[1], None).await;
    let first = post(&e.http, &gw, "/enc/moved", "original").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let (from, to) = (store_key("enc", "original"), store_key("enc", "copy"));
    match &e.redis {
        // Behind the gateway's back, as anyone with access to Redis could.
        Some(r) => {
            let ok: String = r.cmd(&["RENAME", from.as_str(), to.as_str()]);
            assert_eq!(ok, "OK");
        }
        None => {
            let store = gw.gateway.store();
            let raw = store
                .inspect(&from)
                .await
                .unwrap()
                .unwrap()
                .response
                .unwrap();
            plant(store, &to, "/enc/moved", raw).await;
        }
    }
    // The same request under the key the record now sits under.
    let r = post(&e.http, &gw, "/enc/moved", "copy").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert!(!r.replayed());
    assert_eq!(e.up.effects(), 1, "nothing was forwarded");
}

/// Completes `key` on the embedded store with `record` as it is, for a POST of `{}` to
/// `path`.
async fn plant(store: &Store, key: &StoreKey, path: &str, record: Bytes) {
    let headers = HeaderMap::new();
    let view = RequestView {
        method: &Method::POST,
        path,
        query: None,
        headers: &headers,
        body: b"{}",
    };
    let claim = store
        .claim(ClaimRequest {
            key,
            request_hash: &key::request_hash(&view, &key::MatchRule::Request, &[]).unwrap(),
            lease: Duration::from_secs(5),
            window: WINDOW,
            claimant: Claimants::new().next_id(),
            hold: false,
            order: None,
        })
        .await
        .unwrap();
    let Claim::Won { permit, .. } = claim else {
        panic!("{claim:?}")
    };
    let done = store.complete(&permit, record, WINDOW, None).await.unwrap();
    assert_eq!(done, Completion::Completed);
}

async fn a_route_that_keeps_no_body_replays_the_status_only(b: Backend) {
    let e = Env::new(b).await;
    let gw = e.gateway(&[], None).await;
    let h = [("Idempotency-Key", "mint-1"), ("x-test-status", "200")];
    let url = gw.url("/secret/api-keys");
    let first = e.http.post(&url, &h, "{}").await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.text().contains("\"effect\":1"), "{}", first.text());
    // Not even in clear: the store never saw the body.
    let raw = e.raw(&gw, &store_key("secret", "mint-1")).await;
    assert!(!shares_bytes(&raw, &first.body), "the body was stored");
    let second = e.http.post(&url, &h, "{}").await;
    assert_eq!(second.status, StatusCode::OK, "the original status");
    assert!(second.replayed());
    assert_eq!(
        second.problem_type(),
        "urn:dedupe-gateway:problem:response-not-stored"
    );
    assert!(second.headers.contains_key("idempotency-expires"));
    assert_eq!(e.up.effects(), 1);
}

async fn replay_drop_headers_removes_headers_from_replays_only(b: Backend) {
    let e = Env::new(b).await;
    let gw = e.gateway(&[], None).await;
    let h = [
        ("Idempotency-Key", "drop-1"),
        ("x-test-respond-header", "x-request-id=req-1"),
        ("x-test-respond-header", "x-ratelimit-remaining=99"),
        ("x-test-respond-header", "x-ratelimit-reset=60"),
        ("x-test-respond-header", "x-requested-by=kept"),
    ];
    let url = gw.url("/dropping/orders");
    let first = e.http.post(&url, &h, "{}").await;
    for name in [
        "x-request-id",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-requested-by",
    ] {
        assert!(
            first.headers.contains_key(name),
            "first answer lacks {name}"
        );
    }
    let second = e.http.post(&url, &h, "{}").await;
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    for name in ["x-request-id", "x-ratelimit-remaining", "x-ratelimit-reset"] {
        assert!(!second.headers.contains_key(name), "replay kept {name}");
    }
    assert_eq!(second.headers["x-requested-by"], "kept");
    assert_eq!(
        second.headers["content-type"],
        first.headers["content-type"]
    );
    assert_eq!(second.headers["date"], first.headers["date"], "Date stays");
    assert_eq!(e.up.effects(), 1);
    // Dropped before the store: the record never held them.
    let raw = e.raw(&gw, &store_key("dropping", "drop-1")).await;
    assert!(!shares_bytes(&raw, b"x-ratelimit-remaining"));
    assert!(shares_bytes(&raw, b"x-requested-by"));
}

fn expires(r: &Reply) -> Option<SystemTime> {
    let v = r.headers.get("idempotency-expires")?;
    Some(httpdate::parse_http_date(v.to_str().unwrap()).unwrap())
}

async fn idempotency_expires_on_won_and_replayed_answers_unless_turned_off(b: Backend) {
    let e = Env::new(b).await;
    let gw = e.gateway(&[1], None).await;
    let before = SystemTime::now();
    let won = post(&e.http, &gw, "/enc/exp", "exp-1").await;
    let after = SystemTime::now();
    let at = expires(&won).expect("a won answer advertises its expiry");
    // Completion plus the window, to the second (rounded down).
    assert!(at + Duration::from_secs(1) > before + WINDOW, "{at:?}");
    assert!(at <= after + WINDOW, "{at:?}");
    let replayed = post(&e.http, &gw, "/enc/exp", "exp-1").await;
    assert!(replayed.replayed());
    assert_eq!(
        replayed.headers["idempotency-expires"],
        won.headers["idempotency-expires"]
    );

    let quiet = post(&e.http, &gw, "/quiet/exp", "exp-2").await;
    assert_eq!(quiet.status, StatusCode::CREATED);
    assert!(!quiet.headers.contains_key("idempotency-expires"));
    let quiet_again = post(&e.http, &gw, "/quiet/exp", "exp-2").await;
    assert!(quiet_again.replayed());
    assert!(!quiet_again.headers.contains_key("idempotency-expires"));
    assert_eq!(e.up.effects(), 2);
}
