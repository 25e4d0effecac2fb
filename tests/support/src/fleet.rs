//! A fleet: two gateway processes on one Redis (or Valkey), driven by the same keys at
//! once.

use std::collections::HashMap;

use bytes::Bytes;
use http::StatusCode;

use crate::{GatewayConfig, GatewayProcess, Http, RedisServer, RouteCfg, StoreCfg, Upstream};

/// A gateway process on `redis`, one header-keyed route.
pub fn fleet_gateway(up: &Upstream, redis: &RedisServer) -> GatewayProcess {
    let store = StoreCfg::redis(redis.url()).timeout("1s");
    GatewayProcess::start(
        &GatewayConfig::new(up.url())
            .store(store)
            .default_lease("5s")
            .default_window("1h")
            .upstream_timeout("10s")
            .route(RouteCfg::header("orders", "/orders/*")),
    )
}

/// Two gateway processes on `redis`: `keys` keys sent concurrently to both, `rounds` times,
/// execute once each, and every replay, on either, is the answer the upstream gave; a
/// different request under a settled key is refused on both. Each gateway wins some keys
/// and replays the other's.
pub async fn executes_each_key_once(redis: &RedisServer, keys: usize, rounds: usize) {
    let up = Upstream::start().await;
    let gateways = [fleet_gateway(&up, redis), fleet_gateway(&up, redis)];
    let http = Http::new();
    let mut tasks = Vec::new();
    for round in 0..rounds {
        if round == 1 {
            // The first round's requests go out first, half to each gateway, so each wins
            // some keys: the later rounds race claims already made.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        for k in 0..keys {
            let url = gateways[(k + round) % 2].url("/orders/x");
            let http = http.clone();
            tasks.push(tokio::spawn(async move {
                let key = format!("fleet-{k}");
                let r = http
                    .post(
                        &url,
                        &[("Idempotency-Key", &key), ("x-test-delay-ms", "50")],
                        "{}",
                    )
                    .await;
                (key, r)
            }));
        }
    }
    let mut answers: HashMap<String, Bytes> = HashMap::new();
    let mut statuses: HashMap<u16, usize> = HashMap::new();
    for t in tasks {
        let (key, r) = t.await.unwrap();
        *statuses.entry(r.status.as_u16()).or_default() += 1;
        match r.status {
            StatusCode::CREATED => {
                let first = answers.entry(key).or_insert_with(|| r.body.clone());
                assert_eq!(*first, r.body, "a replay differs from the answer");
            }
            StatusCode::CONFLICT => {}
            other => panic!("{other}: {}", r.text()),
        }
    }
    let per_key = up.effects_per_key();
    assert_eq!(per_key.len(), keys, "{statuses:?}");
    assert!(per_key.values().all(|n| *n == 1), "{per_key:?}");
    for (key, body) in &answers {
        for gw in &gateways {
            let r = http
                .post(&gw.url("/orders/x"), &[("Idempotency-Key", key)], "{}")
                .await;
            assert!(r.replayed(), "{key}: {}", r.text());
            assert_eq!(&r.body, body);
            let other = http
                .post(
                    &gw.url("/orders/x"),
                    &[("Idempotency-Key", key)],
                    "{\"other\":1}",
                )
                .await;
            assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
        }
    }
    assert_eq!(up.effects(), keys as u64);
    let stored: Vec<String> = redis.cmd(&["KEYS", "dedupe:*"]);
    assert_eq!(stored.len(), keys, "{stored:?}");
    for k in &stored {
        assert_eq!(redis.cmd::<String>(&["TYPE", k]), "string", "{k}");
    }
}
