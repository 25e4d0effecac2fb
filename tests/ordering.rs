//! Out-of-order versions (`order = { entity, version, compare }`) on the embedded store
//! and on a real redis-server, counted at a real upstream that records what it executed,
//! in order.

use dedupe_test_support::on_every_store;
use dedupe_test_support::{
    Backend, GatewayConfig, Http, RedisServer, Reply, RouteCfg, TestGateway, Upstream,
};
use http::StatusCode;

on_every_store!(
    an_older_version_after_a_newer_one_is_stale_and_never_forwarded,
    concurrent_versions_never_execute_out_of_order,
    a_failed_version_does_not_raise_the_mark_and_runs_again,
    timestamps_in_a_header_compare_as_instants,
);

struct Env {
    up: Upstream,
    http: Http,
    gw: TestGateway,
    _redis: Option<RedisServer>,
}

impl Env {
    /// Routes `/events/*` (integer versions in the body, `on_conflict = "reject"`),
    /// `/waiting/*` (the same with `on_conflict = "wait"`) and `/stamped/*` (timestamps
    /// in a header).
    async fn new(b: Backend) -> Self {
        let (store, redis) = b.start_store();
        let up = Upstream::start().await;
        let config = GatewayConfig::new(up.url())
            .store(store)
            .default_lease("5s")
            .default_window("1h")
            .admin()
            .route(RouteCfg::header("events", "/events/*").order(
                "json:/data/id",
                "json:/data/version",
                "integer",
            ))
            .route(
                RouteCfg::header("waiting", "/waiting/*")
                    .order("json:/data/id", "json:/data/version", "integer")
                    .on_conflict_wait("10s"),
            )
            .route(RouteCfg::header("stamped", "/stamped/*").order(
                "json:/id",
                "header:x-event-time",
                "timestamp",
            ))
            .route(
                RouteCfg::header("labelled", "/labelled/*").order("json:/id", "json:/v", "string"),
            );
        Self {
            gw: TestGateway::start(&config).await,
            up,
            http: Http::new(),
            _redis: redis,
        }
    }

    async fn event(
        &self,
        path: &str,
        key: &str,
        id: u32,
        version: i64,
        extra: &[(&str, &str)],
    ) -> Reply {
        let mut h = vec![("Idempotency-Key", key)];
        h.extend_from_slice(extra);
        let body = format!(r#"{{"data":{{"id":{id},"version":{version}}}}}"#);
        self.http.post(&self.gw.url(path), &h, &body).await
    }

    /// The versions the upstream executed for entity `id`, in the order it received them.
    fn executed(&self, id: u32) -> Vec<i64> {
        self.up
            .seen()
            .iter()
            .filter_map(|s| {
                let v: serde_json::Value = serde_json::from_slice(&s.body).ok()?;
                let data = v.get("data")?;
                (data["id"] == id).then(|| data["version"].as_i64().unwrap())
            })
            .collect()
    }

    async fn counted(&self, route: &str, outcome: &str) -> u64 {
        let text = self
            .http
            .get(&self.gw.admin_url("/metrics"), &[])
            .await
            .text();
        let prefix = format!("dedupe_requests_total{{route=\"{route}\",outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0, |v| v.trim().parse().unwrap())
    }
}

fn stale(r: &Reply) -> bool {
    r.headers.get("dedupe-stale").is_some_and(|v| v == "true")
}

async fn an_older_version_after_a_newer_one_is_stale_and_never_forwarded(b: Backend) {
    let e = Env::new(b).await;
    let v2 = e.event("/events/x", "evt-2", 7, 2, &[]).await;
    assert_eq!(v2.status, StatusCode::CREATED, "{}", v2.text());
    assert!(!stale(&v2));
    // v1 delivered last: answered 200 Dedupe-Stale, never forwarded.
    let v1 = e.event("/events/x", "evt-1", 7, 1, &[]).await;
    assert_eq!(v1.status, StatusCode::OK, "{}", v1.text());
    assert!(stale(&v1), "{v1:?}");
    assert_eq!(
        v1.problem_type(),
        "urn:dedupe-gateway:problem:stale-version"
    );
    // The same version again under a new key is not greater either.
    assert!(stale(&e.event("/events/x", "evt-2-again", 7, 2, &[]).await));
    // A retry of v2's own key still replays its response.
    let again = e.event("/events/x", "evt-2", 7, 2, &[]).await;
    assert!(again.replayed() && !stale(&again), "{again:?}");
    // Other entities have versions of their own.
    let other = e.event("/events/x", "other-1", 8, 1, &[]).await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_eq!(e.up.effects(), 2);
    assert_eq!(e.executed(7), vec![2]);
    assert_eq!(e.counted("events", "stale").await, 2);
    // The record shows the version its claim carried.
    let shown = e.http.get(&e.gw.admin_url("/keys/events/evt-2"), &[]).await;
    let shown: serde_json::Value = serde_json::from_slice(&shown.body).unwrap();
    assert_eq!(shown["version"], "2", "{shown}");
    // A version that is not an integer is the client's error.
    let bad = e
        .http
        .post(
            &e.gw.url("/events/x"),
            &[("Idempotency-Key", "bad")],
            r#"{"data":{"id":7,"version":"two"}}"#,
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        bad.problem_type(),
        "urn:dedupe-gateway:problem:version-invalid"
    );
}

async fn concurrent_versions_never_execute_out_of_order(b: Backend) {
    let e = std::sync::Arc::new(Env::new(b).await);
    // Each round sends v1 and v2 of a fresh entity at once (the upstream slow enough for
    // them to overlap); with `on_conflict = "wait"` both get their final answer.
    for id in 100..110u32 {
        let slow = [("x-test-delay-ms", "80")];
        let (k1, k2) = (format!("w-{id}-1"), format!("w-{id}-2"));
        let (a, b) = tokio::join!(
            e.event("/waiting/x", &k1, id, 1, &slow),
            e.event("/waiting/x", &k2, id, 2, &slow),
        );
        let executed = e.executed(id);
        assert!(
            executed == vec![1, 2] || executed == vec![2],
            "entity {id}: executed {executed:?}"
        );
        assert_eq!(b.status, StatusCode::CREATED, "{}", b.text());
        if executed == vec![2] {
            assert!(stale(&a), "v1 after v2 must be stale: {a:?}");
        } else {
            assert_eq!(a.status, StatusCode::CREATED, "{}", a.text());
        }
    }
    // With `on_conflict = "reject"`, the later of two versions in flight gets 409.
    let before = e.up.effects();
    let h = e.clone();
    let first = tokio::spawn(async move {
        h.event("/events/x", "r-1", 200, 1, &[("x-test-delay-ms", "400")])
            .await
    });
    e.up.wait_for_effects(before + 1).await;
    let second = e.event("/events/x", "r-2", 200, 2, &[]).await;
    assert_eq!(second.status, StatusCode::CONFLICT, "{}", second.text());
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    let second = e.event("/events/x", "r-2", 200, 2, &[]).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert_eq!(e.executed(200), vec![1, 2]);
}

async fn a_failed_version_does_not_raise_the_mark_and_runs_again(b: Backend) {
    let e = Env::new(b).await;
    let failed = e
        .event("/events/x", "f-2", 9, 2, &[("x-test-status", "503")])
        .await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    // The release cleared v2's marker without raising the mark: v1 still runs.
    let v1 = e.event("/events/x", "f-1", 9, 1, &[]).await;
    assert_eq!(v1.status, StatusCode::CREATED, "{}", v1.text());
    // v2 again (the sender's retry) succeeds, and v1 is stale from then on.
    let v2 = e.event("/events/x", "f-2", 9, 2, &[]).await;
    assert_eq!(v2.status, StatusCode::CREATED, "{}", v2.text());
    assert!(stale(&e.event("/events/x", "f-1-again", 9, 1, &[]).await));
    assert_eq!(e.executed(9), vec![2, 1, 2]);
}

async fn timestamps_in_a_header_compare_as_instants(b: Backend) {
    let e = Env::new(b).await;
    let send = |key: &'static str, at: &'static str| {
        let http = e.http.clone();
        let url = e.gw.url("/stamped/x");
        async move {
            http.post(
                &url,
                &[("Idempotency-Key", key), ("x-event-time", at)],
                r#"{"id":"a"}"#,
            )
            .await
        }
    };
    let later = send("t-2", "2026-05-01T12:00:00+02:00").await;
    assert_eq!(later.status, StatusCode::CREATED);
    // 10:30Z is after 10:00Z (12:00+02:00) as an instant, though "10" < "12" as text.
    let after = send("t-3", "2026-05-01T10:30:00Z").await;
    assert_eq!(after.status, StatusCode::CREATED, "{}", after.text());
    let before = send("t-1", "2026-05-01T11:00:00+01:00").await;
    assert!(stale(&before), "{before:?}");
    assert_eq!(e.up.effects(), 2);
}

/// The ordering details decided in issue #23 (docs/routing.md, Stale writes), counted at the
/// upstream: a string version is compared as sent (`"b "` is after `"b"`, not equal and
/// stale); timestamps with `t`/`z` or a space are the instants they name; a leap second is
/// refused; an entity sent as `42` and as `"42"` is one entity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordering_details_decided_deliberately() {
    let e = Env::new(Backend::Memory).await;
    let label = |key: &'static str, body: &'static str| {
        let (http, url) = (e.http.clone(), e.gw.url("/labelled/x"));
        async move { http.post(&url, &[("Idempotency-Key", key)], body).await }
    };
    assert_eq!(
        label("s-1", r#"{"id":42,"v":"b"}"#).await.status,
        StatusCode::CREATED
    );
    let spaced = label("s-2", r#"{"id":42,"v":"b "}"#).await;
    assert_eq!(spaced.status, StatusCode::CREATED, "{}", spaced.text());
    // The entity "42" is the entity 42: "a" is older than its "b ".
    assert!(stale(&label("s-3", r#"{"id":"42","v":"a"}"#).await));
    assert_eq!(e.up.effects(), 2);

    let stamp = |key: &'static str, at: &'static str| {
        let (http, url) = (e.http.clone(), e.gw.url("/stamped/y"));
        async move {
            http.post(
                &url,
                &[("Idempotency-Key", key), ("x-event-time", at)],
                r#"{"id":"b"}"#,
            )
            .await
        }
    };
    let lower = stamp("t-1", "2026-05-01t10:00:00z").await;
    assert_eq!(lower.status, StatusCode::CREATED, "{}", lower.text());
    let spaced = stamp("t-2", "2026-05-01 10:00:01Z").await;
    assert_eq!(spaced.status, StatusCode::CREATED, "{}", spaced.text());
    assert!(stale(&stamp("t-3", "2026-05-01T10:00:00Z").await));
    let leap = stamp("t-4", "2026-06-30T23:59:60Z").await;
    assert_eq!(leap.status, StatusCode::BAD_REQUEST, "{}", leap.text());
    assert_eq!(e.up.effects(), 4);
}
