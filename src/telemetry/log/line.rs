//! The access line, one per request, formatted straight into bytes (pure).
//!
//! Same shape as `tracing-subscriber` gives every other line of the log, so a reader sees one
//! format: in JSON the event's fields flattened beside `timestamp`, `level`, `message` and
//! `target`, and the request span as `span`; in text the span as `request{...}:` and each
//! field as `name=value`. Written without `tracing`'s layers, which cost a third of a
//! streamed request's CPU (`benches/throughput`).

use std::time::SystemTime;

use super::clock::write_rfc3339;

/// The `target` of access lines: `RUST_LOG=info,dedupe_gateway::access=warn` turns them off.
pub const TARGET: &str = "dedupe_gateway::access";

/// What one request did, as its access line says it.
#[derive(Debug, Clone, Copy)]
pub struct AccessLine<'a> {
    /// When the line is written.
    pub at: SystemTime,
    /// The request's method.
    pub method: &'a str,
    /// The request's path as the client sent it.
    pub path: &'a str,
    /// The route's name, `-` for none.
    pub route: &'a str,
    /// What the gateway did.
    pub outcome: &'a str,
    /// How a claim was settled.
    pub finish: Option<&'a str>,
    /// On a shadow route: what enforcement would have done.
    pub would: Option<&'a str>,
    /// The status sent to the client.
    pub status: u16,
    /// The claim's fence.
    pub fence: Option<u64>,
    /// Milliseconds spent on the upstream call.
    pub upstream_ms: Option<f64>,
    /// Milliseconds from the request's head to its answer.
    pub total_ms: f64,
    /// The idempotency key (or fingerprint).
    pub key: Option<&'a str>,
    /// The scope's hash.
    pub scope: Option<&'a str>,
}

enum Value<'a> {
    Str(&'a str),
    Int(u64),
    Float(f64),
}

impl AccessLine<'_> {
    /// The event's fields in the order `tracing` recorded them; absent ones are skipped.
    fn fields(&self) -> [(&'static str, Option<Value<'_>>); 10] {
        [
            ("route", Some(Value::Str(self.route))),
            ("outcome", Some(Value::Str(self.outcome))),
            ("finish", self.finish.map(Value::Str)),
            ("would", self.would.map(Value::Str)),
            ("status", Some(Value::Int(self.status.into()))),
            ("fence", self.fence.map(Value::Int)),
            ("upstream_ms", self.upstream_ms.map(Value::Float)),
            ("total_ms", Some(Value::Float(self.total_ms))),
            ("key", self.key.map(Value::Str)),
            ("scope", self.scope.map(Value::Str)),
        ]
    }

    /// Appends the line as JSON, newline included.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"timestamp\":\"");
        write_rfc3339(out, self.at);
        out.extend_from_slice(b"\",\"level\":\"INFO\",\"message\":\"request\"");
        for (name, value) in self.fields() {
            let Some(value) = value else { continue };
            out.extend_from_slice(b",\"");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":");
            match value {
                Value::Str(s) => json_str(out, s),
                Value::Int(n) => json(out, &n),
                Value::Float(f) => json(out, &f),
            }
        }
        out.extend_from_slice(b",\"target\":\"");
        out.extend_from_slice(TARGET.as_bytes());
        out.extend_from_slice(b"\",\"span\":{\"method\":");
        json_str(out, self.method);
        out.extend_from_slice(b",\"path\":");
        json_str(out, self.path);
        out.extend_from_slice(b",\"name\":\"request\"}}\n");
    }

    /// Appends the line as text, newline included.
    pub fn write_text(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        write_rfc3339(out, self.at);
        // The span's values as `%` shows them: a URI's method and path hold no control
        // characters, but should one come, it is escaped and the line stays one line.
        out.extend_from_slice(b"  INFO request{method=");
        push_shown(out, self.method);
        out.extend_from_slice(b" path=");
        push_shown(out, self.path);
        out.extend_from_slice(b"}: ");
        out.extend_from_slice(TARGET.as_bytes());
        out.extend_from_slice(b": request");
        // Writing to a Vec cannot fail.
        for (name, value) in self.fields() {
            let _ = match value {
                None => continue,
                Some(Value::Str(s)) => write!(out, " {name}={s:?}"),
                Some(Value::Int(n)) => write!(out, " {name}={n}"),
                Some(Value::Float(f)) => write!(out, " {name}={f:?}"),
            };
        }
        out.push(b'\n');
    }
}

impl AccessLine<'_> {
    /// The line as a `tracing` event, the way it was logged before the gateway formatted
    /// it: for a subscriber the gateway did not set up, and to hold the formats to
    /// `tracing-subscriber`'s in the tests. Span and time are the caller's.
    pub fn emit(&self) {
        tracing::info!(
            target: TARGET,
            route = self.route,
            outcome = self.outcome,
            finish = self.finish,
            would = self.would,
            status = self.status,
            fence = self.fence,
            upstream_ms = self.upstream_ms,
            total_ms = self.total_ms,
            key = self.key,
            scope = self.scope,
            "request"
        );
    }
}

/// Appends `text` as it is, but with control characters escaped.
fn push_shown(out: &mut Vec<u8>, text: &str) {
    use std::io::Write;
    for part in text.split_inclusive(char::is_control) {
        match part.char_indices().last() {
            Some((at, c)) if c.is_control() => {
                out.extend_from_slice(&part.as_bytes()[..at]);
                let _ = write!(out, "{}", c.escape_debug());
            }
            _ => out.extend_from_slice(part.as_bytes()),
        }
    }
}

/// Appends `value` as JSON (strings escaped as serde_json escapes them).
/// A string as JSON, as `serde_json` writes it; one with nothing to escape (no `"`, `\\`
/// or control character: nearly every route, outcome, method, path and key) is copied
/// as it is.
fn json_str(out: &mut Vec<u8>, text: &str) {
    if !needs_escape(text.as_bytes()) {
        out.reserve(text.len() + 2);
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else {
        json(out, text);
    }
}

/// Whether `bytes` hold a `"`, a `\\` or a control character (below 0x20): eight bytes
/// at a time (the "has a zero byte" and "has a byte less than" word tests, exact for
/// whether any byte matches).
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES * 0x80;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut v = [0u8; 8];
        v.copy_from_slice(word);
        let v = u64::from_le_bytes(v);
        let control = v.wrapping_sub(ONES * 0x20) & !v & HIGH;
        if control | zero(v ^ (ONES * u64::from(b'"'))) | zero(v ^ (ONES * u64::from(b'\\'))) != 0 {
            return true;
        }
    }
    words
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

fn json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Strings and numbers always serialise, and a Vec takes every byte.
    let _ = serde_json::to_writer(out, value);
}

#[cfg(test)]
mod tests {
    use super::super::captured::Out;
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn line() -> AccessLine<'static> {
        AccessLine {
            at: UNIX_EPOCH + Duration::from_micros(1_796_063_787_509_289),
            method: "POST",
            path: "/orders",
            route: "orders",
            outcome: "won",
            finish: Some("completed"),
            would: None,
            status: 201,
            fence: Some(1_796_063_787_507_808),
            upstream_ms: Some(1.362),
            total_ms: 1.616,
            key: Some("a1"),
            scope: Some("-"),
        }
    }

    /// What `tracing-subscriber` writes for the line's event inside the request span, at
    /// the line's time, in the gateway's JSON or text set-up.
    fn through_tracing_subscriber(line: &AccessLine<'_>, json: bool) -> String {
        use tracing_subscriber::fmt::format::Writer;
        use tracing_subscriber::fmt::time::FormatTime;

        struct At(String);
        impl FormatTime for At {
            fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
                w.write_str(&self.0)
            }
        }

        let mut stamp = Vec::new();
        write_rfc3339(&mut stamp, line.at);
        let out = Out::default();
        let writer = out.clone();
        let builder = tracing_subscriber::fmt()
            .with_timer(At(String::from_utf8(stamp).unwrap()))
            .with_ansi(false)
            .with_writer(move || writer.clone());
        let emit = || {
            let span = tracing::info_span!("request", method = %line.method, path = %line.path);
            span.in_scope(|| line.emit());
        };
        if json {
            let subscriber = builder
                .json()
                .flatten_event(true)
                .with_span_list(false)
                .finish();
            tracing::subscriber::with_default(subscriber, emit);
        } else {
            tracing::subscriber::with_default(builder.finish(), emit);
        }
        out.text()
    }

    fn ours(line: &AccessLine<'_>, json: bool) -> String {
        let mut out = Vec::new();
        if json {
            line.write_json(&mut out);
        } else {
            line.write_text(&mut out);
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn both_formats_are_byte_for_byte_tracing_subscribers() {
        let lines = [
            line(),
            AccessLine {
                route: "-",
                outcome: "passthrough",
                finish: None,
                fence: None,
                key: None,
                scope: None,
                upstream_ms: Some(2.0),
                total_ms: 0.07,
                path: "/a'b\"c\\d/%7E?",
                ..line()
            },
            AccessLine {
                outcome: "shadowed",
                would: Some("replay"),
                key: Some("k \"quoted\" \u{e9}\u{1f600}\u{7f}"),
                upstream_ms: None,
                ..line()
            },
        ];
        for line in &lines {
            for json in [true, false] {
                assert_eq!(ours(line, json), through_tracing_subscriber(line, json));
            }
        }
    }

    #[test]
    fn json_is_what_the_gateway_logged_before() {
        // Captured from the gateway when the line went through tracing's JSON layer.
        let before = r#"{"timestamp":"2026-11-30T18:36:27.509289Z","level":"INFO","message":"request","route":"orders","outcome":"won","finish":"completed","status":201,"fence":1796063787507808,"upstream_ms":1.362,"total_ms":1.616,"key":"a1","scope":"-","target":"dedupe_gateway::access","span":{"method":"POST","path":"/orders","name":"request"}}"#;
        assert_eq!(ours(&line(), true), format!("{before}\n"));
    }

    #[test]
    fn a_string_is_written_as_serde_json_writes_it() {
        let mut texts: Vec<String> = (0u8..128).map(|b| format!("a{}b", b as char)).collect();
        // Each byte at every place of a string longer than a word, and beside non-ASCII.
        for b in 0u8..128 {
            for at in 0..20 {
                let mut text: Vec<char> = "é/orders/0123456789".chars().collect();
                text.insert(at, b as char);
                texts.push(text.into_iter().collect());
            }
        }
        texts.extend(["", "/orders/é\u{7f}", "\u{2028}", "-", "k\"", "\\"].map(String::from));
        for text in texts {
            let mut ours = Vec::new();
            json_str(&mut ours, &text);
            assert_eq!(ours, serde_json::to_vec(&text).unwrap(), "{text:?}");
        }
    }

    #[test]
    fn hostile_values_stay_inside_their_field() {
        let hostile = AccessLine {
            path: "/a\"b\\c\n{\"x\":1}",
            key: Some("k\"\n\u{1}"),
            finish: None,
            fence: None,
            upstream_ms: None,
            total_ms: 2.0,
            ..line()
        };
        let mut out = Vec::new();
        hostile.write_json(&mut out);
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["span"]["path"], "/a\"b\\c\n{\"x\":1}");
        assert_eq!(v["key"], "k\"\n\u{1}");
        assert_eq!(v["total_ms"], 2.0);
        assert!(v.get("finish").is_none() && v.get("x").is_none(), "{v}");
        let mut text = Vec::new();
        hostile.write_text(&mut text);
        assert_eq!(text.iter().filter(|b| **b == b'\n').count(), 1);
    }
}
