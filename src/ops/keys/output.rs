//! `keys` output as text: one `name: value` line per field of a record, one line per
//! record of a listing. `--format json` prints the action's object as it is.

use std::fmt::Write;

use serde_json::Value;

/// A record (`show`) or an action's answer (`resolve`, `delete`) as `name: value` lines,
/// absent fields left out.
pub fn fields(v: &Value) -> String {
    let mut out = String::new();
    if let Value::Object(map) = v {
        for (name, value) in map {
            let shown = match value {
                Value::Null => continue,
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let _ = writeln!(out, "{}: {shown}", name.replace('_', " "));
        }
    }
    out
}

/// A listing: one line per record (state, route, key, scope, fence, attempts, claimed at,
/// lease left), then the count, and how to go on when it stopped early.
pub fn listing(v: &Value) -> String {
    let mut out = String::new();
    let keys = v["keys"].as_array().map(Vec::as_slice).unwrap_or_default();
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    for k in keys {
        let _ = writeln!(
            out,
            "{}\troute={}\tkey={}\tscope={}\tfence={}\tattempts={}\tclaimed_at={}\tlease_left_ms={}",
            text(&k["state"]),
            text(&k["route"]),
            text(&k["key"]),
            text(&k["scope"]),
            text(&k["fence"]),
            text(&k["attempts"]),
            text(&k["claimed_at"]),
            text(&k["lease_left_ms"]),
        );
    }
    let _ = writeln!(
        out,
        "{} {} key(s); {} scanned",
        keys.len(),
        text(&v["state"]),
        text(&v["scanned"])
    );
    if v["truncated"] == Value::Bool(true) {
        let _ = writeln!(out, "truncated: more with --cursor {}", text(&v["cursor"]));
    }
    out
}
