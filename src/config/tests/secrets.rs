//! Store access and secrets: encryption keys, Redis TLS and passwords, Sentinel, the
//! listener's certificate, the near-cache size.

use super::*;

#[test]
fn sentinel_settings_are_checked() {
    let s = "[store]\nbackend = \"redis-sentinel\"\n";
    let one = "sentinels = [\"redis://127.0.0.1:26379\"]\n";
    assert!(err(&format!("{s}master_name = \"m\"\n")).starts_with("store.sentinels: at least one"));
    assert!(err(&format!("{s}{one}")).starts_with("store.master_name: required"));
    assert!(err(&format!("{s}{one}master_name = \"a b\"\n")).starts_with("store.master_name"));
    assert!(err(&format!(
        "{s}{one}master_name = \"m\"\nurl = \"redis://h:1\"\n"
    ))
    .starts_with("store.url"));
    let mixed = "sentinels = [\"redis://a:1\", \"rediss://b:1\"]\nmaster_name = \"m\"\n";
    assert!(err(&format!("{s}{mixed}")).starts_with("store.sentinels: all redis://"));
    assert!(err(&format!(
        "{s}sentinels = [\"http://a:1\"]\nmaster_name = \"m\"\n"
    ))
    .starts_with("store.sentinels"));
    assert!(
        err("[store]\nbackend = \"redis\"\nurl = \"redis://h:1\"\nmaster_name = \"m\"\n")
            .starts_with("store.master_name: applies")
    );
    assert!(err(
        "[store]\nbackend = \"redis\"\nurl = \"redis://h:1\"\nsentinels = [\"redis://h:2\"]\n"
    )
    .starts_with("store.sentinels: applies"));
    let c = with(&format!("{s}sentinels = [\"redis://u:pw@a:26379\", \"redis://b:26379\"]\nmaster_name = \"mymaster\"\n")).unwrap();
    let StoreBackend::Sentinel {
        sentinels,
        master_name,
        ..
    } = &c.store.backend
    else {
        panic!("{:?}", c.store.backend)
    };
    assert_eq!(sentinels.len(), 2);
    assert_eq!(master_name, "mymaster");
    assert!(!format!("{:?}", c.store).contains("pw"));
}

#[test]
fn encryption_keys_are_read_checked_and_never_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let hex_key = "ab".repeat(32);
    let good = dir.path().join("good");
    std::fs::write(&good, format!("{hex_key}\n")).unwrap();
    let raw = dir.path().join("raw");
    std::fs::write(&raw, [0x5a; 32]).unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, "cd".repeat(20)).unwrap();
    let keys = |list: &str| format!("[store]\nencryption_keys = {list}\n");
    let env_key = "ef".repeat(32);
    let load = |list: &str| {
        let mut f = FileConfig::parse(&format!("{BASE}{}", keys(list))).unwrap();
        let env = |k: &str| (k == "DEDUPE_KEY_1").then(|| env_key.clone());
        f.apply_env(env);
        Config::from_file_in(f, &env)
    };

    let c = load(&format!(
        "[\"file:{}\", \"file:{}\", \"env:DEDUPE_KEY_1\"]",
        good.display(),
        raw.display()
    ))
    .unwrap();
    assert_eq!(c.store.encryption.key_ids().len(), 3);
    let shown = format!("{c:?}");
    assert!(!shown.contains(&hex_key[..16]) && !shown.contains(&env_key[..16]));
    assert!(!with("").unwrap().store.encryption.is_enabled());

    let e = load(&format!("[\"file:{}\"]", short.display()))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("store.encryption_keys[0]: the key file"),
        "{e}"
    );
    assert!(e.contains("holds 40 bytes"), "{e}");
    assert!(!e.contains("cdcd"), "{e}");
    let e = load("[\"file:/nonexistent/key\"]").unwrap_err().to_string();
    assert!(e.contains("cannot read the key file"), "{e}");
    let e = load("[\"env:DEDUPE_KEY_2\"]").unwrap_err().to_string();
    assert!(e.contains("DEDUPE_KEY_2 is not set"), "{e}");
    let e = load("[\"/run/key\"]").unwrap_err().to_string();
    assert!(e.contains("file:"), "{e}");
    let e = load(&format!(
        "[\"file:{}\", \"env:DEDUPE_KEY_1\", \"file:{}\"]",
        good.display(),
        good.display()
    ))
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("store.encryption_keys[2]: is the same key"),
        "{e}"
    );
}

#[test]
fn redis_urls_never_show_their_password() {
    assert_eq!(
        redact_url("rediss://app:s3cret@redis.example:6380/0"),
        "rediss://app:***@redis.example:6380/0"
    );
    assert_eq!(redact_url("redis://:s3cret@h:1"), "redis://:***@h:1");
    assert_eq!(redact_url("redis://s3cret@h:1"), "redis://***@h:1");
    assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
    // Neither an error nor the config's Debug carries it.
    let e = err("[store]\nbackend = \"redis\"\nurl = \"ftp://app:s3cret@h:1\"\n");
    assert!(!e.contains("s3cret") && e.contains("app:***@h:1"), "{e}");
    let c = with("[store]\nbackend = \"redis\"\nurl = \"rediss://app:s3cret@h:1\"\n").unwrap();
    assert!(!format!("{c:?}").contains("s3cret"));
}

#[test]
fn redis_tls_fields_are_checked_and_name_themselves() {
    let redis = "[store]\nbackend = \"redis\"\n";
    let e = err(&format!(
        "{redis}url = \"redis://h:1\"\ntls_ca_file = \"/x\"\n"
    ));
    assert!(
        e.starts_with("store.tls_ca_file: applies to rediss://"),
        "{e}"
    );
    let e = err(&format!(
        "{redis}url = \"rediss://h:1\"\ntls_ca_file = \"/nonexistent/ca.pem\"\n"
    ));
    assert!(
        e.starts_with("store.tls_ca_file: /nonexistent/ca.pem: cannot read"),
        "{e}"
    );
    let e = err(&format!(
        "{redis}url = \"rediss://h:1\"\ntls_cert_file = \"/x\"\n"
    ));
    assert!(e.starts_with("store.tls_key_file: required"), "{e}");
    let e = err(&format!("{redis}url = \"rediss://h:1/#insecure\"\n"));
    assert!(e.contains("store.tls_insecure"), "{e}");
    let c = with(&format!(
        "{redis}url = \"rediss://h:1\"\ntls_insecure = true\n"
    ))
    .unwrap();
    assert!(c.store.backend.access().unwrap().insecure);
    assert!(
        c.warnings.iter().any(|w| w.contains("tls_insecure")),
        "{:?}",
        c.warnings
    );
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let e = err(&format!(
        "{redis}url = \"rediss://h:1\"\ntls_ca_file = \"{}\"\n",
        junk.display()
    ));
    assert!(
        e.contains("store.tls_ca_file") && e.contains("no PEM certificate"),
        "{e}"
    );
}

#[test]
fn the_redis_password_comes_from_the_environment_and_is_never_shown() {
    let mut file = FileConfig::parse(&format!(
        "{BASE}[store]\nbackend = \"redis\"\nurl = \"rediss://app@h:1\"\n"
    ))
    .unwrap();
    file.apply_env(|k| (k == "DEDUPE_REDIS_PASSWORD").then(|| "pw-from-env".to_owned()));
    let c = Config::from_file(file).unwrap();
    let access = c.store.backend.access().unwrap();
    assert_eq!(access.password.as_deref(), Some("pw-from-env"));
    assert!(!format!("{c:?}").contains("pw-from-env"));
}

#[test]
fn listener_tls_files_are_checked_and_name_their_field() {
    let ca = dedupe_test_support::TestCa::new("config");
    let (a, b) = (ca.issue("a"), ca.issue("b"));
    let tls = |cert: &std::path::Path, key: &std::path::Path| {
        format!(
            "[server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            cert.display(),
            key.display()
        )
    };
    let c = with(&tls(&a.cert, &a.key)).unwrap();
    assert!(c.server.tls.is_some());
    let e = err(&tls(&a.cert, &b.key));
    assert!(
        e.starts_with("server.tls.key_file: ") && e.contains("does not match"),
        "{e}"
    );
    let e = err(&tls(&a.key, &a.key));
    assert!(
        e.starts_with("server.tls.cert_file: ") && e.contains("no PEM certificate"),
        "{e}"
    );
    let e = err(&tls(std::path::Path::new("/nonexistent.pem"), &a.key));
    assert!(
        e.starts_with("server.tls.cert_file: /nonexistent.pem: cannot read"),
        "{e}"
    );
}

#[test]
fn near_cache_is_a_size_on_the_redis_and_cluster_backends_only() {
    let redis = "[store]\nbackend = \"redis\"\nurl = \"redis://h:1\"\n";
    let near_cache = |c: Config| match c.store.backend {
        StoreBackend::Redis { near_cache, .. } | StoreBackend::Cluster { near_cache, .. } => {
            near_cache
        }
        other => panic!("{other:?}"),
    };
    let c = with(&format!("{redis}near_cache = \"8MiB\"\n")).unwrap();
    assert_eq!(near_cache(c), 8 * 1024 * 1024);
    assert_eq!(near_cache(with(redis).unwrap()), 0, "off by default");
    assert!(err(&format!("{redis}near_cache = \"lots\"\n")).starts_with("store.near_cache"));
    let cluster = "[store]\nbackend = \"redis-cluster\"\nurls = [\"redis://h:1\"]\n";
    let c = with(&format!("{cluster}near_cache = \"8MiB\"\n")).unwrap();
    assert_eq!(near_cache(c), 8 * 1024 * 1024);
    let sentinel = "[store]\nbackend = \"redis-sentinel\"\nsentinels = [\"redis://h:1\"]\nmaster_name = \"m\"\n";
    assert!(
        err(&format!("{sentinel}near_cache = \"8MiB\"\n")).starts_with("store.near_cache: applies")
    );
    assert!(err("[store]\nnear_cache = \"1MiB\"\n").starts_with("store.near_cache: applies"));
}
