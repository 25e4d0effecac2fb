//! `routes[].verify`: scheme, secrets, tolerance, and what `check` warns about.

use super::*;

fn route(verify: &str) -> String {
    format!(
        "[[routes]]\nname = \"hooks\"\nmethods = [\"POST\"]\npath = \"/hooks\"\npreset = \"github\"\nverify = {verify}\n"
    )
}

#[test]
fn verify_reads_its_secrets_and_names_each_error() {
    let dir = tempfile::tempdir().unwrap();
    let new = dir.path().join("new");
    std::fs::write(&new, "fresh-secret\n").unwrap();
    let c = with(&route(&format!(
        "{{ secrets = [\"file:{}\", \"file:{}\"] }}",
        new.display(),
        new.display()
    )))
    .unwrap();
    let v = c.routes[0].verify.as_ref().unwrap();
    assert_eq!(v.scheme().as_str(), "github");
    assert_eq!(v.secret_count(), 2);
    assert!(!format!("{c:?}").contains("fresh-secret"));
    for (verify, at, says) in [
        (
            "{ secrets = [] }",
            "routes[hooks].verify.secrets",
            "at least one",
        ),
        (
            "{ secrets = [\"inline\"] }",
            "routes[hooks].verify.secrets[0]",
            "env:VARIABLE",
        ),
        (
            "{ secrets = [\"env:NOPE\"] }",
            "routes[hooks].verify.secrets[0]",
            "NOPE is not set",
        ),
        (
            "{ secrets = [\"env:X\"], tolerance = \"1m\" }",
            "routes[hooks].verify.tolerance",
            "signs no timestamp",
        ),
        (
            "{ secrets = [\"env:X\"], scheme = \"gitlab\" }",
            "routes[hooks].verify.scheme",
            "`stripe`",
        ),
        (
            "{ secret = [\"env:X\"] }",
            "routes[hooks].verify",
            "unknown field",
        ),
    ] {
        let e = err(&route(verify));
        assert!(e.starts_with(at), "{verify}: {e}");
        assert!(e.contains(says), "{verify}: {e}");
        assert!(!e.contains("inline"), "{e}");
    }
}

#[test]
fn a_scheme_needs_a_preset_or_its_own_name_and_secrets_fit_it() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, "sk_live_not_a_webhook_secret").unwrap();
    let plain = format!(
        "[[routes]]\nname = \"s\"\nmethods = [\"POST\"]\npath = \"/s\"\nkey = {{ fingerprint = [\"json:/id\"] }}\nverify = {{ secrets = [\"file:{}\"] }}\n",
        key.display()
    );
    assert!(err(&plain).starts_with("routes[s].verify.scheme: required"));
    let stripe = plain.replace("verify = {", "verify = { scheme = \"stripe\",");
    let e = err(&stripe);
    assert!(
        e.starts_with("routes[s].verify.secrets[0]: the file"),
        "{e}"
    );
    assert!(e.contains("whsec_") && !e.contains("sk_live"), "{e}");
    std::fs::write(&key, "whsec_abc").unwrap();
    let c = with(&stripe.replace("verify = {", "verify = { tolerance = \"10m\",")).unwrap();
    let v = c.routes[0].verify.as_ref().unwrap();
    assert_eq!(v.tolerance().as_secs(), 600);
}

#[test]
fn a_preset_without_verify_releases_the_receivers_refusals() {
    use crate::protocol::route::StatusMeaning;
    let preset = |extra: &str| {
        with(&format!(
            "[[routes]]\nname = \"hooks\"\nmethods = [\"POST\"]\npath = \"/hooks\"\npreset = \"shopify\"\n{extra}"
        ))
        .unwrap()
    };
    let unverified = preset("");
    let r = &unverified.routes[0];
    for status in [401, 403, 429, 503] {
        assert_eq!(
            r.statuses.classify(status),
            StatusMeaning::Retry,
            "{status}"
        );
    }
    assert_eq!(r.statuses.classify(404), StatusMeaning::Final);
    assert_eq!(r.statuses.classify(504), StatusMeaning::Unknown);
    assert!(unverified.warnings[0].contains("preset shopify without verify"));

    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("s");
    std::fs::write(&secret, "x").unwrap();
    let verified = preset(&format!(
        "verify = {{ secrets = [\"file:{}\"] }}\n",
        secret.display()
    ));
    let r = &verified.routes[0];
    assert_eq!(r.statuses.classify(401), StatusMeaning::Final);
    assert!(verified.warnings.is_empty(), "{:?}", verified.warnings);
    // A route's own list is taken as written.
    let own = preset("retry_statuses = [503]\n");
    assert_eq!(own.routes[0].statuses.classify(401), StatusMeaning::Final);
    // A plain route keeps the defaults.
    let plain = with("[[routes]]\nname = \"p\"\nmethods = [\"POST\"]\npath = \"/p\"\nkey = { header = \"K\" }\nscope = [\"header:A\"]\n").unwrap();
    assert_eq!(plain.routes[0].statuses.classify(401), StatusMeaning::Final);
}

#[test]
fn verify_settings_that_do_less_than_they_seem_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("s");
    std::fs::write(&secret, "whsec_abc").unwrap();
    let c = with(&route(&format!(
        "{{ scheme = \"stripe\", secrets = [\"file:{}\"] }}\nmode = \"off\"",
        secret.display()
    )))
    .unwrap();
    assert!(
        c.warnings
            .iter()
            .any(|w| w.starts_with("routes[hooks].verify: mode = \"off\"")),
        "{:?}",
        c.warnings
    );
    let c = with(&route(&format!(
        "{{ scheme = \"stripe\", secrets = [\"file:{}\"] }}",
        secret.display()
    )))
    .unwrap();
    assert!(
        c.warnings
            .iter()
            .any(|w| w.starts_with("routes[hooks].verify.scheme: stripe on a github preset")),
        "{:?}",
        c.warnings
    );
}
