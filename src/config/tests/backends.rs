//! `[store]` as a typed backend: each `backend` validates to its own variant with exactly
//! its settings, and a field that belongs to another backend is refused, naming it.

use super::*;
use crate::config::defaults::{DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS};

const REDIS: &str = "[store]\nbackend = \"redis\"\nurl = \"redis://h:1\"\n";
const CLUSTER: &str =
    "[store]\nbackend = \"redis-cluster\"\nurls = [\"redis://a:1\", \"redis://b:2\"]\n";
const SENTINEL: &str =
    "[store]\nbackend = \"redis-sentinel\"\nsentinels = [\"redis://s:26379\"]\nmaster_name = \"m\"\n";

#[test]
fn each_backend_validates_to_its_own_variant() {
    let memory = with("").unwrap().store.backend;
    assert_eq!(
        memory,
        StoreBackend::Memory {
            max_records: DEFAULT_MAX_RECORDS,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    );
    let limited = with("[store]\nmax_records = 5\nmax_bytes = \"1MiB\"\n").unwrap();
    assert_eq!(
        limited.store.backend,
        StoreBackend::Memory {
            max_records: 5,
            max_bytes: 1024 * 1024,
        }
    );
    let redis = with(REDIS).unwrap().store.backend;
    assert_eq!(
        redis,
        StoreBackend::Redis {
            url: "redis://h:1".into(),
            near_cache: 0,
            access: RedisAccess::default(),
        }
    );
    let StoreBackend::Cluster { urls, .. } = with(CLUSTER).unwrap().store.backend else {
        panic!("not a cluster");
    };
    assert_eq!(
        urls,
        ["redis://a:1", "redis://b:2"],
        "the seeds in file order"
    );
    let StoreBackend::Sentinel {
        sentinels,
        master_name,
        ..
    } = with(SENTINEL).unwrap().store.backend
    else {
        panic!("not a sentinel backend");
    };
    assert_eq!(
        (sentinels.as_slice(), master_name.as_str()),
        (&["redis://s:26379".to_owned()][..], "m")
    );
}

#[test]
fn the_kind_is_named_as_the_file_names_it() {
    for (file, name) in [
        ("", "memory"),
        (REDIS, "redis"),
        (CLUSTER, "redis-cluster"),
        (SENTINEL, "redis-sentinel"),
    ] {
        let c = with(file).unwrap();
        assert_eq!(c.store.backend.kind().as_str(), name);
        assert_eq!(
            c.store.backend.access().is_some(),
            name != "memory",
            "{name}"
        );
        assert_eq!(c.store.tags_by_entity(), name == "redis-cluster", "{name}");
    }
}

#[test]
fn a_field_of_another_backend_is_refused_naming_it() {
    let memory = "[store]\n";
    for (file, extra, field) in [
        (
            memory,
            "url = \"redis://h:1\"\n",
            "store.url: set only with",
        ),
        (
            memory,
            "urls = [\"redis://h:1\"]\n",
            "store.url: set only with",
        ),
        (
            memory,
            "sentinels = [\"redis://h:1\"]\n",
            "store.sentinels: applies",
        ),
        (
            memory,
            "master_name = \"m\"\n",
            "store.master_name: applies",
        ),
        (
            memory,
            "tls_ca_file = \"/ca.pem\"\n",
            "store.tls_ca_file: applies",
        ),
        (
            memory,
            "tls_insecure = false\n",
            "store.tls_insecure: applies",
        ),
        (REDIS, "urls = [\"redis://h:1\"]\n", "store.urls: is for"),
        (REDIS, "max_records = 5\n", "store.max_records: applies"),
        (REDIS, "max_bytes = \"1MiB\"\n", "store.max_bytes: applies"),
        (CLUSTER, "url = \"redis://h:1\"\n", "store.url: is for"),
        (
            CLUSTER,
            "master_name = \"m\"\n",
            "store.master_name: applies",
        ),
        (CLUSTER, "max_records = 5\n", "store.max_records: applies"),
        (
            SENTINEL,
            "urls = [\"redis://h:1\"]\n",
            "store.urls: is not for",
        ),
        (
            SENTINEL,
            "max_bytes = \"1MiB\"\n",
            "store.max_bytes: applies",
        ),
        (
            REDIS,
            "tls_cert_file = \"/c.pem\"\n",
            "store.tls_cert_file: applies",
        ),
    ] {
        let e = err(&format!("{file}{extra}"));
        assert!(e.starts_with(field), "{file}{extra}: {e}");
    }
}

#[test]
fn a_backend_without_its_required_fields_is_refused_naming_them() {
    let sentinel = "[store]\nbackend = \"redis-sentinel\"\nsentinels = [\"redis://s:1\"]\n";
    assert!(err(sentinel).starts_with("store.master_name: required"));
    let sentinel = "[store]\nbackend = \"redis-sentinel\"\nmaster_name = \"m\"\nsentinels = []\n";
    assert!(err(sentinel).starts_with("store.sentinels: at least one"));
    assert!(err("[store]\nbackend = \"redis-cluster\"\n").starts_with("store.urls: at least one"));
    assert!(err("[store]\nbackend = \"redis\"\n").starts_with("store.url: required"));
}

#[test]
fn the_password_belongs_to_the_redis_backends() {
    let password = |store: &str| {
        let mut f = FileConfig::parse(&format!("{BASE}{store}")).unwrap();
        f.apply_env(|k| (k == "DEDUPE_REDIS_PASSWORD").then(|| "pw".to_owned()));
        Config::from_file(f)
    };
    let e = password("[store]\n").unwrap_err().to_string();
    assert!(
        e.starts_with("DEDUPE_REDIS_PASSWORD: ")
            && e.contains("Redis backends only")
            && e.contains("(it sets the Redis password)")
            && !e.contains("store.password"),
        "{e}"
    );
    for store in [REDIS, CLUSTER, SENTINEL] {
        let c = password(store).unwrap();
        let access = c.store.backend.access().unwrap();
        assert_eq!(access.password.as_deref(), Some("pw"), "{store}");
    }
}

#[test]
fn debug_never_shows_a_url_password_on_any_backend() {
    for store in [
        "[store]\nbackend = \"redis\"\nurl = \"redis://u:s3cret@h:1\"\n",
        "[store]\nbackend = \"redis-cluster\"\nurls = [\"redis://h:1\", \"redis://u:s3cret@h:2\"]\n",
        "[store]\nbackend = \"redis-sentinel\"\nsentinels = [\"redis://u:s3cret@h:1\"]\nmaster_name = \"m\"\n",
    ] {
        let c = with(store).unwrap();
        let shown = format!("{:?}", c.store);
        assert!(!shown.contains("s3cret") && shown.contains("u:***@h"), "{shown}");
    }
}

#[test]
fn a_record_layout_is_refused_by_name_whatever_it_says() {
    for file in [REDIS, CLUSTER, SENTINEL, "[store]\n"] {
        for name in ["\"string\"", "\"hash\"", "1"] {
            let bad = err(&format!("{file}record_layout = {name}\n"));
            assert!(
                bad.starts_with("store.record_layout: no longer a setting")
                    && bad.contains("the string layout, the only one"),
                "{bad}"
            );
        }
    }
}
