//! `[admin]`: never open beyond loopback by accident; the token from its source.

use super::*;

fn admin(body: &str) -> String {
    format!("[admin]\n{body}")
}

#[test]
fn an_admin_port_beyond_loopback_needs_a_token_or_the_words_to_go_without() {
    for listen in ["0.0.0.0:9901", "[::]:9901", "10.1.2.3:9901"] {
        let e = err(&admin(&format!("listen = \"{listen}\"\n")));
        assert!(e.starts_with("admin.token: required"), "{e}");
        assert!(
            e.contains(listen) && e.contains("allow_unauthenticated"),
            "{e}"
        );
    }
    for listen in ["127.0.0.1:9901", "[::1]:9901", "127.0.0.1:0"] {
        let c = with(&admin(&format!("listen = \"{listen}\"\n"))).unwrap();
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }
    let c = with(&admin("listen = \"0.0.0.0:9901\"\ntoken = \"t\"\n")).unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let open = with(&admin(
        "listen = \"0.0.0.0:9901\"\nallow_unauthenticated = true\n",
    ))
    .unwrap();
    assert!(open.admin.as_ref().unwrap().is_open());
    assert!(
        open.warnings
            .iter()
            .any(|w| w.starts_with("admin.allow_unauthenticated = true")),
        "{:?}",
        open.warnings
    );
}

#[test]
fn the_token_comes_from_its_source_and_is_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "from-a-file\n").unwrap();
    let load = |token: &str| {
        let f = FileConfig::parse(&format!(
            "{BASE}{}",
            admin(&format!("listen = \"0.0.0.0:9901\"\ntoken = \"{token}\"\n"))
        ))
        .unwrap();
        let env = |k: &str| (k == "ADMIN_TOKEN").then(|| "from-the-env".to_owned());
        Config::from_file_in(f, &env)
    };
    let c = load(&format!("file:{}", file.display())).unwrap();
    assert_eq!(
        c.admin.as_ref().unwrap().token.as_deref(),
        Some("from-a-file")
    );
    let c = load("env:ADMIN_TOKEN").unwrap();
    assert_eq!(
        c.admin.as_ref().unwrap().token.as_deref(),
        Some("from-the-env")
    );
    assert!(!format!("{c:?}").contains("from-the-env"));
    let c = load("literal-token").unwrap();
    assert_eq!(c.admin.unwrap().token.as_deref(), Some("literal-token"));
    let e = load("env:UNSET").unwrap_err().to_string();
    assert_eq!(e, "admin.token: the environment variable UNSET is not set");
    assert!(err(&admin("listen = \"127.0.0.1:1\"\ntoken = \"\"\n"))
        .starts_with("admin.token: must not be empty"));
}
