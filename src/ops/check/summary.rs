//! `check` without `--request`: the configuration as the gateway reads it, one line per
//! route.

use std::fmt::Write;

use super::{list, methods};
use crate::config::{format_duration, Config};
use crate::protocol::key::{KeyRule, MatchRule};
use crate::protocol::route::{OnConflict, OnUnknown, Route};

/// `check` without `--request`: the file's listener, upstream, store and encryption, where
/// traces go, its warnings, and one line per route with every setting that decides what a request gets.
pub fn summary(c: &Config) -> String {
    let mut out = String::new();
    let upstream = &c.server.upstream;
    let _ = writeln!(
        out,
        "configuration ok: listen {}, upstream {}://{}{}, store {}",
        c.server.listen,
        upstream.scheme,
        upstream.authority,
        upstream.base_path,
        c.store.backend.kind().as_str(),
    );
    // Keys by id only: `check` output never shows key material.
    let ids: Vec<String> = c
        .store
        .encryption
        .key_ids()
        .iter()
        .map(ToString::to_string)
        .collect();
    let _ = match ids.split_first() {
        Some((first, [])) => writeln!(out, "stored responses encrypted: key id {first}"),
        Some((first, rest)) => writeln!(
            out,
            "stored responses encrypted: key id {first}; also decrypting key ids {}",
            rest.join(", ")
        ),
        None => writeln!(out, "stored responses not encrypted"),
    };
    if let Some(t) = &c.telemetry {
        let (url, name) = (&t.otlp_endpoint, &t.service_name);
        let _ = write!(
            out,
            "traces exported to {url} (OTLP/HTTP) as service {name}"
        );
        if t.sample_ratio < 1.0 {
            let _ = write!(out, ", {} of the traces begun here", t.sample_ratio);
        }
        out.push('\n');
    }
    for w in &c.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    if c.routes.is_empty() {
        let _ = writeln!(out, "no routes: every request is proxied without dedupe");
    }
    for r in &c.routes {
        route_line(&mut out, r);
    }
    out
}

/// One route's settings on one line.
fn route_line(out: &mut String, r: &Route) {
    let key = match &r.key {
        KeyRule::Header { name, required, .. } => format!(
            "header {name} ({})",
            if *required { "required" } else { "optional" }
        ),
        KeyRule::Fingerprint(parts) => format!("fingerprint [{}]", list(parts)),
    };
    let conflict = match r.on_conflict {
        OnConflict::Reject => "reject".to_owned(),
        OnConflict::Wait => format!("wait up to {}", format_duration(r.conflict_wait)),
        OnConflict::Join => format!("join, or wait up to {}", format_duration(r.conflict_wait)),
    };
    let scope = if r.scope.is_empty() {
        "-".to_owned()
    } else {
        format!("[{}]", list(&r.scope))
    };
    let must_match = match &r.must_match {
        MatchRule::Request => "request".to_owned(),
        MatchRule::Parts(p) if p.is_empty() => "key".to_owned(),
        MatchRule::Parts(p) => format!("[{}]", list(p)),
    };
    let on_unknown = match r.on_unknown {
        OnUnknown::Retry => "retry",
        OnUnknown::Hold => "hold",
    };
    let _ = writeln!(
        out,
        "route {}: {} {} key={} lease={} window={} on_conflict={}{} scope={} match={} on_unknown={} mode={}{}",
        r.name,
        methods(r),
        r.path.as_str(),
        key,
        format_duration(r.lease),
        format_duration(r.window),
        conflict,
        if r.store_body { "" } else { " store_body=false" },
        scope,
        must_match,
        on_unknown,
        r.mode.as_str(),
        // How many secrets, never what they are.
        r.verify.as_ref().map_or(String::new(), |v| format!(
            " verify={} ({} secret(s))",
            v.scheme().as_str(),
            v.secret_count()
        )),
    );
}
