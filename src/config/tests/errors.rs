//! `errors` and `problem_base_url`: inheritance, presets, templates read and checked.

use std::io::Write;

use super::*;
use crate::protocol::route::dialect::Envelope;

fn route(name: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"{name}\"\nmethods = [\"POST\"]\npath = \"/{name}\"\n\
         key = {{ header = \"Idempotency-Key\" }}\nscope = []\n{extra}\n"
    )
}

fn preset(name: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nname = \"{name}\"\nmethods = [\"POST\"]\npath = \"/{name}\"\n\
         preset = \"github\"\n{extra}\n"
    )
}

fn template_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn problem_is_the_default_with_urn_types() {
    let c = with(&route("a", "")).unwrap();
    assert_eq!(c.routes[0].errors, Dialect::default());
    assert_eq!(c.routes[0].errors.envelope, Envelope::Problem);
    assert_eq!(c.errors, Dialect::default());
}

#[test]
fn routes_inherit_defaults_and_override_them_and_presets_keep_problem_json() {
    let c = with(&format!(
        "[defaults]\nerrors = \"stripe\"\nproblem_base_url = \"https://docs.example.com/problems/\"\n{}{}{}{}{}",
        route("inherits", ""),
        route("own", "errors = \"problem\"\nproblem_base_url = \"https://other.example.com/p#\""),
        preset("webhook", ""),
        preset("webhook-own", "errors = \"stripe\""),
        route("off", "mode = \"off\""),
    ))
    .unwrap();
    let envelope = |i: usize| c.routes[i].errors.envelope.as_str();
    let base = |i: usize| c.routes[i].errors.problem_base_url.as_deref();
    assert_eq!(envelope(0), "stripe");
    assert_eq!(base(0), Some("https://docs.example.com/problems/"));
    assert_eq!(envelope(1), "problem");
    assert_eq!(base(1), Some("https://other.example.com/p#"));
    // A webhook sender does not read bodies: `[defaults] errors` stops at a preset...
    assert_eq!(envelope(2), "problem");
    assert_eq!(base(2), Some("https://docs.example.com/problems/"));
    // ...unless the route asks for a dialect itself.
    assert_eq!(envelope(3), "stripe");
    assert_eq!(envelope(4), "stripe");
    // Answers made before a route is known take the defaults.
    assert_eq!(c.errors.envelope, Envelope::Stripe);
    assert_eq!(
        c.errors.problem_type("path-invalid"),
        "https://docs.example.com/problems/path-invalid"
    );
}

#[test]
fn a_dialect_name_or_table_that_is_not_one_names_the_field() {
    let e = err(&route("a", "errors = \"stripey\""));
    assert!(
        e.starts_with("routes[a].errors: ")
            && e.contains("expected \"problem\", \"stripe\" or a table like { template"),
        "{e}"
    );
    let e = err(&route("a", "errors = 5"));
    assert!(e.starts_with("routes[a].errors: "), "{e}");
    let e = err(&route(
        "a",
        "errors = { template = \"x.json\", content = \"a/b\" }",
    ));
    assert!(
        e.starts_with("routes[a].errors: ") && e.contains("unknown field `content`"),
        "{e}"
    );
    let e = err("[defaults]\nerrors = \"problem+json\"\n");
    assert!(e.starts_with("defaults.errors: "), "{e}");
    let e = err("[defaults]\nproblem_base_url = \"docs/problems/\"\n");
    assert!(e.starts_with("defaults.problem_base_url: "), "{e}");
    let e = err(&route(
        "a",
        "problem_base_url = \"https://x.example.com/p\"",
    ));
    assert!(
        e.starts_with("routes[a].problem_base_url: ") && e.contains("must end with"),
        "{e}"
    );
}

#[test]
fn a_template_is_read_and_filled_at_load() {
    let f = template_file(r#"{"error": {"status": {{status}}, "message": "{{title}}"}}"#);
    let path = f.path().display();
    let c = with(&route(
        "a",
        &format!(
            "errors = {{ template = \"{path}\", content_type = \"application/vnd.acme+json\" }}"
        ),
    ))
    .unwrap();
    let Envelope::Template(t) = &c.routes[0].errors.envelope else {
        panic!("{:?}", c.routes[0].errors);
    };
    assert_eq!(t.content_type(), "application/vnd.acme+json");
    // Without content_type: JSON.
    let c = with(&format!(
        "[defaults]\nerrors = {{ template = \"{path}\" }}\n{}",
        route("a", "")
    ))
    .unwrap();
    let Envelope::Template(t) = &c.routes[0].errors.envelope else {
        panic!("{:?}", c.routes[0].errors);
    };
    assert_eq!(t.content_type(), "application/json");
}

#[test]
fn a_template_that_is_not_json_once_filled_is_refused_naming_the_field_and_file() {
    let f = template_file(r#"{"error": {"message": {{title}}}}"#);
    let path = f.path().display().to_string();
    let e = err(&route(
        "a",
        &format!("errors = {{ template = \"{path}\" }}"),
    ));
    assert!(
        e.starts_with(&format!(
            "routes[a].errors.template: {path}: not valid JSON once filled"
        )) && e.contains("\"{{title}}\""),
        "{e}"
    );
    let e = err(&format!(
        "[defaults]\nerrors = {{ template = \"{path}\" }}\n"
    ));
    assert!(e.starts_with("defaults.errors.template: "), "{e}");

    let f = template_file(r#"{"message": "{{message}}"}"#);
    let path = f.path().display().to_string();
    let e = err(&route(
        "a",
        &format!("errors = {{ template = \"{path}\" }}"),
    ));
    assert!(
        e.starts_with("routes[a].errors.template: ")
            && e.contains("unknown placeholder `{{message}}`"),
        "{e}"
    );

    let e = err(&route(
        "a",
        "errors = { template = \"/nonexistent/errors.json\" }",
    ));
    assert!(
        e.starts_with("routes[a].errors.template: cannot read /nonexistent/errors.json"),
        "{e}"
    );

    let f = template_file("{}");
    let path = f.path().display().to_string();
    let e = err(&route(
        "a",
        &format!("errors = {{ template = \"{path}\", content_type = \"json\" }}"),
    ));
    assert!(e.starts_with("routes[a].errors.content_type: "), "{e}");

    let big = format!(
        "{{\"pad\": \"{}\"}}",
        "x".repeat(defaults::MAX_TEMPLATE_BYTES as usize)
    );
    let f = template_file(&big);
    let path = f.path().display().to_string();
    let e = err(&route(
        "a",
        &format!("errors = {{ template = \"{path}\" }}"),
    ));
    assert!(
        e.starts_with("routes[a].errors.template: ") && e.contains("larger than 65536 bytes"),
        "{e}"
    );
}
