//! How the gateway's own answers on a route are written (`errors = ...`): RFC 9457
//! problem+json, Stripe's error object, or a JSON template of the operator's; and where
//! problem types point (`problem_base_url`). Pure: the template is parsed and filled here;
//! `problem` decides what goes into an answer and builds it.

use std::fmt;
use std::sync::Arc;

use http::header::HeaderValue;
use serde::Deserialize;

/// A route's dialect of errors: the envelope of the gateway's own answers and the base of
/// their problem types.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dialect {
    /// What the answer's body looks like.
    pub envelope: Envelope,
    /// `problem_base_url`: problem types are `{base}{name}` (a documentation link);
    /// without it, `urn:dedupe-gateway:problem:{name}`.
    pub problem_base_url: Option<Arc<str>>,
}

/// `errors = "problem" | "stripe" | { template = "...", content_type = "..." }`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Envelope {
    /// RFC 9457 `application/problem+json`.
    #[default]
    Problem,
    /// Stripe's error object, `{"error": {"type", "code", "message"}}`, with the statuses
    /// Stripe's clients read as an idempotency error.
    Stripe,
    /// The operator's JSON template.
    Template(Arc<Template>),
    /// gRPC (a `grpc = true` route): trailers-only answers, HTTP 200, `grpc-status` and a
    /// percent-encoded `grpc-message`.
    Grpc,
}

/// `errors = "problem" | "stripe"`: the envelopes the gateway knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", expecting = "\"problem\" or \"stripe\"")]
pub enum BuiltIn {
    /// RFC 9457 problem+json.
    Problem,
    /// Stripe's error object.
    Stripe,
}

impl From<BuiltIn> for Envelope {
    fn from(b: BuiltIn) -> Self {
        match b {
            BuiltIn::Problem => Envelope::Problem,
            BuiltIn::Stripe => Envelope::Stripe,
        }
    }
}

impl Envelope {
    /// The name as written in the file (`template` for a template).
    pub fn as_str(&self) -> &'static str {
        match self {
            Envelope::Problem => "problem",
            Envelope::Stripe => "stripe",
            Envelope::Template(_) => "template",
            Envelope::Grpc => "grpc",
        }
    }
}

impl Dialect {
    /// `{problem_base_url}{name}`, or `urn:dedupe-gateway:problem:{name}`.
    pub fn problem_type(&self, name: &str) -> String {
        match &self.problem_base_url {
            Some(base) => format!("{base}{name}"),
            None => format!("urn:dedupe-gateway:problem:{name}"),
        }
    }
}

/// What a template may say, each written `{{name}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholder {
    /// The HTTP status, digits only (a JSON number bare, or text inside a string).
    Status,
    /// The problem type: a URI.
    Type,
    /// The problem's short stable name (`request-in-flight`).
    Name,
    /// The problem's title.
    Title,
    /// What the client can fix, when the gateway says it; empty otherwise.
    Detail,
}

impl Placeholder {
    const ALL: [Placeholder; 5] = [
        Placeholder::Status,
        Placeholder::Type,
        Placeholder::Name,
        Placeholder::Title,
        Placeholder::Detail,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Placeholder::Status => "status",
            Placeholder::Type => "type",
            Placeholder::Name => "name",
            Placeholder::Title => "title",
            Placeholder::Detail => "detail",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

/// The values an answer fills a template with.
#[derive(Debug, Clone, Copy)]
pub struct Fields<'a> {
    /// The status code.
    pub status: u16,
    /// The problem type URI.
    pub kind: &'a str,
    /// The problem's short name.
    pub name: &'a str,
    /// The title.
    pub title: &'a str,
    /// The client-safe detail, if any.
    pub detail: Option<&'a str>,
}

impl Fields<'_> {
    /// Sample values that need every kind of JSON escaping: a template that stays valid
    /// JSON with these stays valid with any. A string placeholder written outside quotes
    /// breaks on the quote, one after a backslash on the letter that follows it.
    pub const SAMPLE: Fields<'static> = Fields {
        status: 409,
        kind: "Sample \"type\" \\ /",
        name: "Sample \"name\"",
        title: "Sample \"title\" \\ \n\t\u{1} é",
        detail: Some("Sample \"detail\" \\ \r"),
    };
}

/// Why a template was refused.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// `{{` without its `}}`.
    #[error("`{{{{` at byte {0} is not closed with `}}}}`")]
    Unclosed(usize),
    /// `{{name}}` that is none of the placeholders.
    #[error("unknown placeholder `{{{{{name}}}}}` (write one of {known})")]
    Unknown {
        /// What the template wrote.
        name: String,
        /// The placeholders there are.
        known: String,
    },
    /// Filled with sample values, the template is not JSON.
    #[error(
        "not valid JSON once filled with sample values ({0}); string placeholders are \
         JSON-escaped without quotes, so write them inside a string: \"{{{{title}}}}\""
    )]
    NotJson(serde_json::Error),
    /// `content_type` that is not a media type.
    #[error("{0:?} is not a media type like \"application/json\"")]
    ContentType(String),
}

/// A validated template: text and placeholders, and the content type it is sent with.
#[derive(Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
    content_type: HeaderValue,
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Template")
            .field("content_type", &self.content_type)
            .field("pieces", &self.pieces.len())
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Value(Placeholder),
}

impl Template {
    /// Parses `text` (`{{status}}`, `{{type}}`, `{{name}}`, `{{title}}`, `{{detail}}`,
    /// spaces inside the braces allowed) and checks that it is JSON once filled with
    /// [`Fields::SAMPLE`].
    pub fn new(text: &str, content_type: &str) -> Result<Self, TemplateError> {
        let content_type = media_type(content_type)?;
        let mut pieces = Vec::new();
        let mut rest = text;
        let mut offset = 0;
        while let Some(open) = rest.find("{{") {
            let (before, after) = rest.split_at(open);
            if !before.is_empty() {
                pieces.push(Piece::Text(before.to_owned()));
            }
            let close = after
                .find("}}")
                .ok_or(TemplateError::Unclosed(offset + open))?;
            let name = after[2..close].trim();
            let placeholder = Placeholder::parse(name).ok_or_else(|| TemplateError::Unknown {
                name: name.to_owned(),
                known: Placeholder::ALL
                    .map(|p| format!("{{{{{}}}}}", p.as_str()))
                    .join(", "),
            })?;
            pieces.push(Piece::Value(placeholder));
            offset += open + close + 2;
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        let template = Self {
            pieces,
            content_type,
        };
        serde_json::from_str::<serde::de::IgnoredAny>(&template.fill(&Fields::SAMPLE))
            .map_err(TemplateError::NotJson)?;
        Ok(template)
    }

    /// The template with every placeholder replaced: the status as digits, the strings
    /// JSON-escaped without their quotes (an absent detail as nothing).
    pub fn fill(&self, fields: &Fields<'_>) -> String {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Value(Placeholder::Status) => out.push_str(&fields.status.to_string()),
                Piece::Value(Placeholder::Type) => escape_into(&mut out, fields.kind),
                Piece::Value(Placeholder::Name) => escape_into(&mut out, fields.name),
                Piece::Value(Placeholder::Title) => escape_into(&mut out, fields.title),
                Piece::Value(Placeholder::Detail) => {
                    escape_into(&mut out, fields.detail.unwrap_or_default())
                }
            }
        }
        out
    }

    /// The `Content-Type` the answer carries.
    pub fn content_type(&self) -> &HeaderValue {
        &self.content_type
    }
}

/// `type/subtype` with optional parameters, usable as a header value.
fn media_type(v: &str) -> Result<HeaderValue, TemplateError> {
    let essence = v.split(';').next().unwrap_or_default().trim();
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    match essence.split_once('/') {
        Some((t, s)) if token(t) && token(s) => {
            HeaderValue::from_str(v).map_err(|_| TemplateError::ContentType(v.to_owned()))
        }
        _ => Err(TemplateError::ContentType(v.to_owned())),
    }
}

/// `s` as the inside of a JSON string.
fn escape_into(out: &mut String, s: &str) {
    // serde_json writes a string (which cannot fail) with its quotes; the quotes are the
    // template's.
    let quoted = serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned());
    out.push_str(&quoted[1..quoted.len() - 1]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(detail: Option<&'static str>) -> Fields<'static> {
        Fields {
            status: 400,
            kind: "urn:dedupe-gateway:problem:idempotency-key-missing",
            name: "idempotency-key-missing",
            title: "Idempotency key missing",
            detail,
        }
    }

    #[test]
    fn placeholders_are_filled_and_strings_escaped() {
        let t = Template::new(
            r#"{"code": {{status}}, "kind": "{{ type }}", "id": "{{name}}", "msg": "{{title}}: {{detail}}"}"#,
            "application/vnd.api+json",
        )
        .unwrap();
        let out = t.fill(&fields(Some("header \"Idempotency-Key\" is missing\n")));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["code"], 400);
        assert_eq!(
            v["kind"],
            "urn:dedupe-gateway:problem:idempotency-key-missing"
        );
        assert_eq!(v["id"], "idempotency-key-missing");
        assert_eq!(
            v["msg"],
            "Idempotency key missing: header \"Idempotency-Key\" is missing\n"
        );
        assert_eq!(t.content_type(), "application/vnd.api+json");
        // No detail: nothing in its place.
        let v: serde_json::Value = serde_json::from_str(&t.fill(&fields(None))).unwrap();
        assert_eq!(v["msg"], "Idempotency key missing: ");
    }

    #[test]
    fn every_sample_value_survives_escaping() {
        let t = Template::new(
            r#"["{{type}}", "{{name}}", "{{title}}", "{{detail}}", "{{status}}"]"#,
            "application/json",
        )
        .unwrap();
        let v: Vec<String> = serde_json::from_str(&t.fill(&Fields::SAMPLE)).unwrap();
        let s = Fields::SAMPLE;
        assert_eq!(
            v,
            [s.kind, s.name, s.title, s.detail.unwrap(), "409"].map(str::to_owned)
        );
    }

    #[test]
    fn a_template_that_is_not_json_once_filled_is_refused() {
        for (text, why) in [
            // A string placeholder outside quotes.
            (r#"{"title": {{title}}}"#, "not valid JSON"),
            (r#"{"detail": {{detail}}}"#, "not valid JSON"),
            // After a backslash inside a string.
            (r#"{"title": "\{{title}}"}"#, "not valid JSON"),
            // Broken without any placeholder.
            (r#"{"status": {{status}},}"#, "not valid JSON"),
            ("", "not valid JSON"),
            (r#"{"x": "{{titel}}"}"#, "unknown placeholder `{{titel}}`"),
            (r#"{"x": "{{title"}"#, "is not closed"),
        ] {
            let e = Template::new(text, "application/json").unwrap_err();
            assert!(e.to_string().contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn a_bare_status_is_a_number() {
        let t = Template::new(r#"{"status": {{status}}}"#, "application/json").unwrap();
        assert_eq!(t.fill(&fields(None)), r#"{"status": 400}"#);
    }

    #[test]
    fn the_content_type_must_be_a_media_type() {
        for bad in ["json", "", "application/", "text/plain\n", "a b/c"] {
            assert!(Template::new("{}", bad).is_err(), "{bad:?}");
        }
        for good in [
            "application/json",
            "application/problem+json; charset=utf-8",
        ] {
            assert!(Template::new("{}", good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn problem_types_are_urns_unless_a_base_is_set() {
        let mut d = Dialect::default();
        assert_eq!(
            d.problem_type("request-in-flight"),
            "urn:dedupe-gateway:problem:request-in-flight"
        );
        d.problem_base_url = Some("https://docs.example.com/problems/".into());
        assert_eq!(
            d.problem_type("request-in-flight"),
            "https://docs.example.com/problems/request-in-flight"
        );
    }
}
