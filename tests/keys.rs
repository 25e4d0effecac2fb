//! `dedupe-gateway keys` (the real binary) against a real gateway process and its admin API:
//! a held key found with `keys list`, shown and resolved; a record deleted; a fingerprint
//! named by its body; in-flight claims listed in pages; a wrong token. Then `Store::list`
//! on every backend, a Redis Cluster's masters included, and its bounds.

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dedupe_gateway::store::listing::{ListRequest, Wanted};
use dedupe_gateway::store::{
    ClaimRequest, Claimant, MemoryStore, RecordState, RedisClusterStore, RedisStore, RequestHash,
    Store, StoreKey,
};
use dedupe_test_support::{
    on_every_store, slot_of, Backend, GatewayConfig, GatewayProcess, Http, RedisCluster,
    RedisServer, RouteCfg, StoreCfg, Upstream,
};
use http::StatusCode;
use serde_json::Value;

const TOKEN: &str = "keys-test-token";
const ALICE: &str = "Authorization: Bearer alice";

fn config(up: &str, store: StoreCfg) -> GatewayConfig {
    GatewayConfig::new(up)
        .store(store)
        .upstream_timeout("10s")
        .route(
            RouteCfg::header("held", "/held/*")
                .lease("1s")
                .scope(&["header:Authorization"])
                .on_unknown_hold(),
        )
        .route(RouteCfg::fingerprint(
            "hooks",
            "/hooks/*",
            &["json:/order_id"],
        ))
        .route(RouteCfg::header("slow", "/slow/*").lease("5s"))
        .admin_with_token(TOKEN)
}

struct Env {
    up: Upstream,
    gw: GatewayProcess,
    http: Http,
    _redis: Option<RedisServer>,
}

async fn env(b: Backend) -> Env {
    let up = Upstream::start().await;
    let (store, redis) = b.start_store();
    let gw = GatewayProcess::start(&config(&up.url(), store));
    Env {
        up,
        gw,
        http: Http::new(),
        _redis: redis,
    }
}

impl Env {
    /// `dedupe-gateway keys ARGS --admin URL --token T` (and `--config` for one record).
    async fn keys(&self, args: &[&str]) -> Output {
        self.keys_with_token(args, TOKEN).await
    }

    async fn keys_with_token(&self, args: &[&str], token: &str) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"));
        cmd.arg("keys").args(args);
        if args[0] != "list" {
            cmd.arg("--config").arg(&self.gw.config_path);
        }
        cmd.args(["--admin", &self.gw.admin_url(""), "--token", token])
            .env_remove("DEDUPE_ADMIN_TOKEN")
            .env_remove("DEDUPE_CONFIG");
        tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap()
    }

    /// `keys ARGS --format json`, which must succeed.
    async fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["--format", "json"]);
        let out = self.keys(&all).await;
        assert!(out.status.success(), "keys {args:?}: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Lists `state` until `key` shows (a lease runs out in its own time).
    async fn listed(&self, state: &str, key: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let page = self.json(&["list", "--state", state]).await;
            let keys = page["keys"].as_array().unwrap();
            if let Some(k) = keys.iter().find(|k| k["key"] == key) {
                return k.clone();
            }
            assert!(
                Instant::now() < deadline,
                "{key} never listed {state}: {page}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

on_every_store!(
    a_held_key_is_listed_shown_and_resolved,
    a_record_is_deleted_and_a_fingerprint_is_named_by_its_body,
    stalled_calls_are_listed_in_flight_in_pages,
);

async fn a_held_key_is_listed_shown_and_resolved(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/held/k1");
    let auth = ("Authorization", "Bearer alice");
    // The upstream dies mid-call: the outcome is unknown, and the route holds it.
    for key in ["k1", "k2"] {
        let r = e
            .http
            .post(
                &e.gw.url(&format!("/held/{key}")),
                &[("Idempotency-Key", key), auth, ("x-test-drop", "1")],
                "{}",
            )
            .await;
        assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    }
    let listed = e.listed("held", "k1").await;
    assert_eq!(listed["state"], "unknown", "{listed}");
    assert_eq!(listed["route"], "held");

    let record = ["--route", "held", "--key", "k1", "-H", ALICE];
    let shown = e.json(&[&["show"], &record[..]].concat()).await;
    assert_eq!(shown["store_key"], listed["store_key"], "{shown}");
    assert_eq!(shown["scope"], listed["scope"]);
    assert!(shown.get("derived_store_key").is_none(), "{shown}");
    assert_eq!(shown["held"], true);
    let fence = shown["fence"].as_u64().unwrap();
    assert_eq!(listed["fence"], fence);
    // Text: one field a line.
    let text = e.keys(&[&["show"], &record[..]].concat()).await;
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("state: unknown"), "{text}");

    // Another scope is another record.
    let bob = e
        .keys(&[
            "show",
            "--route",
            "held",
            "--key",
            "k1",
            "-H",
            "Authorization: Bearer bob",
        ])
        .await;
    assert_eq!(bob.status.code(), Some(1), "{}", stderr(&bob));
    assert!(stderr(&bob).contains("404"), "{}", stderr(&bob));
    assert!(
        !stderr(&bob).contains("scopes its keys"),
        "{}",
        stderr(&bob)
    );
    // No scope at all: the refusal says which parts the route scopes by.
    let unscoped = e.keys(&["show", "--route", "held", "--key", "k1"]).await;
    assert_eq!(unscoped.status.code(), Some(1), "{}", stderr(&unscoped));
    assert!(
        stderr(&unscoped)
            .contains("route held scopes its keys by header:authorization: not given here"),
        "{}",
        stderr(&unscoped)
    );

    let stale = (fence - 1).to_string();
    let refused = e
        .keys(
            &[
                &["resolve"],
                &record[..],
                &["--fence", &stale, "--as", "retry"],
            ]
            .concat(),
        )
        .await;
    assert_eq!(refused.status.code(), Some(1), "a stale fence is refused");
    assert!(
        stderr(&refused).contains("dedupe-gateway keys show --route held"),
        "{}",
        stderr(&refused)
    );
    let fence = fence.to_string();
    let resolved = e
        .json(
            &[
                &["resolve"],
                &record[..],
                &["--fence", &fence, "--as", "retry"],
            ]
            .concat(),
        )
        .await;
    assert_eq!(resolved["action"], "resolve");
    assert_eq!(resolved["as"], "retry");
    assert_eq!(resolved["store_key"], listed["store_key"]);

    // Resolved as retry: the next request executes, and the key is no longer held.
    let r = e
        .http
        .post(&url, &[("Idempotency-Key", "k1"), auth], "{}")
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(e.up.effects(), 3);

    // Resolved as done: the given response is what retries get.
    let k2 = e.listed("held", "k2").await;
    let fence = k2["fence"].to_string();
    let done = [
        "resolve",
        "--route",
        "held",
        "--key",
        "k2",
        "-H",
        ALICE,
        "--fence",
        &fence,
        "--as",
        "done",
        "--status",
        "201",
        "--response-header",
        "Content-Type: application/json",
        "--response-body",
        r#"{"id":"by-hand"}"#,
    ];
    let out = e.keys(&done).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let r = e
        .http
        .post(
            &e.gw.url("/held/k2"),
            &[("Idempotency-Key", "k2"), auth],
            "{}",
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(r.replayed());
    assert_eq!(r.text(), r#"{"id":"by-hand"}"#);
    assert_eq!(e.up.effects(), 3, "replayed, not executed");
    let page = e.json(&["list", "--state", "held"]).await;
    assert_eq!(page["keys"].as_array().unwrap().len(), 0, "{page}");

    // A wrong token: the admin's problem, and a failure.
    let wrong = e
        .keys_with_token(&["list", "--state", "held"], "nope")
        .await;
    assert_eq!(wrong.status.code(), Some(1));
    assert!(stderr(&wrong).contains("401"), "{}", stderr(&wrong));
}

async fn a_record_is_deleted_and_a_fingerprint_is_named_by_its_body(b: Backend) {
    let e = env(b).await;
    let url = e.gw.url("/hooks/orders");
    let body = r#"{"order_id":"o-1","n":1}"#;
    let r = e.http.post(&url, &[], body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());

    // No --key: the fingerprint is derived from the body, as the gateway derives it.
    let record = ["--route", "hooks", "--body", body];
    let shown = e.json(&[&["show"], &record[..]].concat()).await;
    assert_eq!(shown["state"], "completed", "{shown}");
    assert!(shown.get("derived_store_key").is_none(), "{shown}");
    let fingerprint = shown["key"].as_str().unwrap().to_owned();
    // The fingerprint itself names it too.
    let by_key = e
        .json(&["show", "--route", "hooks", "--key", &fingerprint])
        .await;
    assert_eq!(by_key["store_key"], shown["store_key"]);

    let deleted = e.json(&[&["delete"], &record[..]].concat()).await;
    assert_eq!(deleted["action"], "delete");
    let gone = e.keys(&[&["show"], &record[..]].concat()).await;
    assert_eq!(gone.status.code(), Some(1), "{}", stderr(&gone));
    let r = e.http.post(&url, &[], body).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert!(!r.replayed(), "deleted: the next request executes again");
    assert_eq!(e.up.effects(), 2);

    // A header-keyed route without --key is a usage error, before any call.
    let usage = e.keys(&["show", "--route", "held"]).await;
    assert_eq!(usage.status.code(), Some(64), "{}", stderr(&usage));
}

async fn stalled_calls_are_listed_in_flight_in_pages(b: Backend) {
    let e = env(b).await;
    let mut calls = Vec::new();
    for key in ["s1", "s2", "s3"] {
        let (http, url) = (e.http.clone(), e.gw.url(&format!("/slow/{key}")));
        calls.push(tokio::spawn(async move {
            http.post(
                &url,
                &[("Idempotency-Key", key), ("x-test-delay-ms", "3000")],
                "{}",
            )
            .await
        }));
    }
    for key in ["s1", "s2", "s3"] {
        let l = e.listed("in-flight", key).await;
        assert_eq!(l["state"], "in-flight", "{l}");
        assert!(l["lease_left_ms"].as_u64().unwrap() > 0, "{l}");
    }
    // Two pages of at most two.
    let first = e
        .json(&[
            "list",
            "--state",
            "in-flight",
            "--route",
            "slow",
            "--limit",
            "2",
        ])
        .await;
    assert_eq!(first["keys"].as_array().unwrap().len(), 2, "{first}");
    assert_eq!(first["truncated"], true);
    let cursor = first["cursor"].as_str().unwrap().to_owned();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut page = first;
    let mut cursor = Some(cursor);
    loop {
        for k in page["keys"].as_array().unwrap() {
            seen.insert(k["key"].as_str().unwrap().to_owned());
        }
        let Some(c) = cursor.take() else { break };
        page = e
            .json(&[
                "list",
                "--state",
                "in-flight",
                "--route",
                "slow",
                "--limit",
                "2",
                "--cursor",
                &c,
            ])
            .await;
        cursor = page["cursor"].as_str().map(str::to_owned);
    }
    assert_eq!(
        seen,
        BTreeSet::from(["s1".into(), "s2".into(), "s3".into()])
    );
    // The admin API's bounds, as its problem.
    let zero = e
        .keys(&["list", "--state", "in-flight", "--limit", "0"])
        .await;
    assert_eq!(zero.status.code(), Some(1));
    assert!(stderr(&zero).contains("400"), "{}", stderr(&zero));
    // Nothing is held: these claims are live.
    let held = e.json(&["list", "--state", "held"]).await;
    assert_eq!(held["keys"].as_array().unwrap().len(), 0, "{held}");
    for c in calls {
        assert_eq!(c.await.unwrap().status, StatusCode::CREATED);
    }
}

// ---- Store::list on every backend, a cluster's masters included ----

static CLAIMANT: AtomicU64 = AtomicU64::new(1);

/// Claims `n` keys of route `route` under `prefix` (in flight, lease 30s).
async fn claim_many(store: &Store, prefix: &str, route: &str, n: usize) -> Vec<StoreKey> {
    let hash = RequestHash::new([7; 32]);
    let mut keys = Vec::new();
    for i in 0..n {
        let key = dedupe_gateway::protocol::key::store_key(prefix, route, "-", &format!("key-{i}"));
        let claim = store
            .claim(ClaimRequest {
                key: &key,
                request_hash: &hash,
                lease: Duration::from_secs(30),
                window: Duration::from_secs(60),
                claimant: Claimant::new(u128::from(CLAIMANT.fetch_add(1, Ordering::Relaxed))),
                hold: false,
                order: None,
            })
            .await
            .unwrap();
        assert!(
            matches!(claim, dedupe_gateway::store::Claim::Won { .. }),
            "{claim:?}"
        );
        keys.push(key);
    }
    keys
}

/// Every page of a listing of `limit`: the store keys, and how many pages it took.
async fn every_page(
    store: &Store,
    prefix: &str,
    route: &str,
    limit: usize,
) -> (Vec<String>, usize) {
    let mut req = ListRequest {
        wanted: Wanted::InFlight,
        prefix: prefix.to_owned(),
        route: Some(route.to_owned()),
        limit,
        cursor: None,
    };
    let (mut found, mut pages) = (Vec::new(), 0);
    loop {
        let page = store.list(&req).await.unwrap();
        pages += 1;
        assert!(page.records.len() <= limit);
        assert_eq!(page.truncated, page.cursor.is_some());
        for r in &page.records {
            assert_eq!(r.state, RecordState::InFlight);
            assert_eq!(r.name.as_ref().unwrap().route, route);
        }
        found.extend(page.records.into_iter().map(|r| r.store_key));
        match page.cursor {
            Some(c) => req.cursor = Some(c),
            None => break,
        }
        assert!(pages < 100, "a listing that never ends");
    }
    found.sort();
    (found, pages)
}

async fn lists_every_record_in_pages(store: Store, prefix: &str) {
    let mut keys: Vec<String> = claim_many(&store, prefix, "pay", 23)
        .await
        .iter()
        .map(|k| k.as_str().to_owned())
        .collect();
    // Another route's records are not this route's.
    claim_many(&store, prefix, "other", 3).await;
    keys.sort();
    let (all, pages) = every_page(&store, prefix, "pay", 1000).await;
    assert_eq!((all.len(), pages), (23, 1));
    assert_eq!(all, keys);
    let (paged, pages) = every_page(&store, prefix, "pay", 5).await;
    let mut unique = paged.clone();
    unique.dedup();
    assert_eq!(unique, keys, "every record, in pages of 5");
    assert!(pages >= 5, "{pages} pages");
    // None is held.
    let held = store
        .list(&ListRequest {
            wanted: Wanted::Held,
            prefix: prefix.to_owned(),
            route: None,
            limit: 1000,
            cursor: None,
        })
        .await
        .unwrap();
    assert!(held.records.is_empty() && !held.truncated);
}

#[tokio::test]
async fn memory_store_lists_in_pages() {
    lists_every_record_in_pages(Store::Memory(MemoryStore::new(1000)), "dg").await;
}

#[tokio::test]
async fn redis_lists_in_pages() {
    let r = RedisServer::start();
    let store = RedisStore::new(&r.url(), Duration::from_secs(2)).unwrap();
    lists_every_record_in_pages(Store::Redis(store), "dg").await;
}

/// The same on a cluster, records on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_lists_records_on_every_master() {
    let cluster = RedisCluster::start();
    let store = RedisClusterStore::new(&cluster.urls(), Duration::from_secs(2)).unwrap();
    lists_every_record_in_pages(Store::Cluster(Box::new(store)), "dgcs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_listing_finds_records_on_every_master() {
    let cluster = RedisCluster::start();
    let store = RedisClusterStore::new(&cluster.urls(), Duration::from_secs(2)).unwrap();
    let store = Store::Cluster(Box::new(store));
    lists_every_record_in_pages(store.clone(), "dgc").await;
    // The records listed live on every master.
    let (all, _) = every_page(&store, "dgc", "pay", 1000).await;
    let owners: BTreeSet<usize> = all
        .iter()
        .map(|k| {
            let slot = slot_of(k);
            cluster
                .nodes
                .iter()
                .position(|n| owns(n, slot))
                .expect("a master owns every slot")
        })
        .collect();
    assert_eq!(owners.len(), cluster.nodes.len(), "records on every master");

    // The same through a gateway's admin API and the CLI.
    let up = Upstream::start().await;
    let config = GatewayConfig::new(up.url())
        .store(StoreCfg::cluster(cluster.urls()).prefix("dgc"))
        .route(RouteCfg::header("pay", "/pay/*"))
        .admin_with_token(TOKEN);
    let e = Env {
        gw: GatewayProcess::start(&config),
        up,
        http: Http::new(),
        _redis: None,
    };
    let page = e
        .json(&[
            "list",
            "--state",
            "in-flight",
            "--route",
            "pay",
            "--limit",
            "1000",
        ])
        .await;
    let mut listed: Vec<String> = page["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["store_key"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    assert_eq!(listed, all, "{page}");
    assert_eq!(page["truncated"], false);
}

/// Whether `node` holds a key in `slot` (only the slot's master does).
fn owns(node: &RedisServer, slot: u16) -> bool {
    let out = Command::new("redis-cli")
        .args([
            "-u",
            &node.url(),
            "CLUSTER",
            "GETKEYSINSLOT",
            &slot.to_string(),
            "1",
        ])
        .output()
        .unwrap();
    !String::from_utf8_lossy(&out.stdout).trim().is_empty()
}
