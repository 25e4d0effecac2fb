//! What a drill run found, as text for a person or JSON for CI. Pure.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::store::health::{Finding, Severity};

/// The five drills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Drill {
    /// The same request twice: one effect, the second a byte-identical replay.
    Replay,
    /// A duplicate while the first is slow: 409 or a wait, never a second effect.
    Lease,
    /// The winner's gateway dies mid-call: after the lease, a takeover with a higher fence.
    Crash,
    /// N concurrent identical requests: one effect.
    Race,
    /// The same key with a different request: 422, never executed.
    Misuse,
}

impl Drill {
    /// Every drill, in the order they run.
    pub const ALL: [Drill; 5] = [
        Drill::Replay,
        Drill::Lease,
        Drill::Crash,
        Drill::Race,
        Drill::Misuse,
    ];

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Drill::Replay => "replay",
            Drill::Lease => "lease",
            Drill::Crash => "crash",
            Drill::Race => "race",
            Drill::Misuse => "misuse",
        }
    }
}

/// One drill on one route.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The route.
    pub route: String,
    /// Which drill.
    pub drill: Drill,
    /// Whether it passed.
    pub pass: bool,
    /// What was seen: effect counts, statuses, fences, timings.
    pub evidence: Map<String, Value>,
    /// Why it failed, or a note (a drill that does not apply).
    pub note: Option<String>,
    /// How long it took.
    pub millis: u64,
    /// Not run: the route does not enforce dedupe (`mode = "shadow"` or `"off"`), so the
    /// drill would fail by design. A skipped drill does not fail the run.
    pub skipped: bool,
}

impl Outcome {
    /// A drill not run on a route whose `mode` is not `enforce`.
    pub fn skipped(route: &str, drill: Drill, mode: &str) -> Self {
        let why =
            format!("mode = {mode} (the route does not enforce dedupe; drill it once it does)");
        Self::skipped_because(route, drill, &why)
    }

    /// A drill not run on a route, and why.
    pub fn skipped_because(route: &str, drill: Drill, why: &str) -> Self {
        Self {
            route: route.to_owned(),
            drill,
            pass: true,
            evidence: Map::new(),
            note: Some(format!("skipped: {why}")),
            millis: 0,
            skipped: true,
        }
    }
}

/// The store checks.
#[derive(Debug, Clone, Serialize)]
pub struct StoreCheck {
    /// The backend.
    pub backend: &'static str,
    /// No risk found and the store answered.
    pub pass: bool,
    /// What the checks found.
    pub findings: Vec<Finding>,
    /// Why the store could not be checked.
    pub error: Option<String>,
}

impl StoreCheck {
    /// A check from findings, or from the error that prevented it.
    pub fn new(backend: &'static str, result: Result<Vec<Finding>, String>) -> Self {
        match result {
            Ok(findings) => Self {
                backend,
                pass: !findings.iter().any(|f| f.severity == Severity::Risk),
                findings,
                error: None,
            },
            Err(e) => Self {
                backend,
                pass: false,
                findings: Vec::new(),
                error: Some(e),
            },
        }
    }
}

/// Removing the drill's records.
#[derive(Debug, Clone, Serialize)]
pub struct Cleanup {
    /// Records the drill made and deleted.
    pub deleted: usize,
    /// Records still there afterwards (each one a failure).
    pub left: Vec<String>,
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `config` (in-process gateway, counting upstream) or `target` (a live gateway).
    pub mode: &'static str,
    /// Facts about the run: the lease override, the key prefix, the target.
    pub setup: Map<String, Value>,
    /// Store checks (config mode).
    pub store: Option<StoreCheck>,
    /// Every drill on every route.
    pub drills: Vec<Outcome>,
    /// Removing what the drill made.
    pub cleanup: Option<Cleanup>,
    /// Everything passed.
    pub pass: bool,
}

impl Report {
    /// Sets `pass` from the parts.
    pub fn finish(mut self) -> Self {
        self.pass = self.failures().is_empty();
        self
    }

    /// Every drill was skipped: the run proved nothing, so it does not pass.
    fn nothing_ran(&self) -> bool {
        !self.drills.is_empty() && self.drills.iter().all(|d| d.skipped)
    }

    /// The names of what failed (`store`, `payments/replay`, `cleanup`).
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.store.as_ref().is_some_and(|s| !s.pass) {
            out.push("store".to_owned());
        }
        out.extend(
            self.drills
                .iter()
                .filter(|d| !d.pass)
                .map(|d| format!("{}/{}", d.route, d.drill.as_str())),
        );
        if self.cleanup.as_ref().is_some_and(|c| !c.left.is_empty()) {
            out.push("cleanup".to_owned());
        }
        if self.nothing_ran() {
            out.push("nothing drilled (every route skipped)".to_owned());
        }
        out
    }

    /// As JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// As text, one line per check.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let verdict = |pass| if pass { "PASS" } else { "FAIL" };
        let drill_verdict = |d: &Outcome| if d.skipped { "SKIP" } else { verdict(d.pass) };
        let setup: Vec<String> = self
            .setup
            .iter()
            .map(|(k, v)| format!("{k}={}", plain(v)))
            .collect();
        out.push_str(&format!("drill ({}): {}\n", self.mode, setup.join(" ")));
        if let Some(s) = &self.store {
            let what = match (&s.error, s.findings.is_empty()) {
                (Some(e), _) => format!("cannot check the store: {e}"),
                (None, true) => "no findings".to_owned(),
                (None, false) => format!("{} finding(s)", s.findings.len()),
            };
            out.push_str(&format!(
                "{} store {}: {what}\n",
                verdict(s.pass),
                s.backend
            ));
            for f in &s.findings {
                let level = match f.severity {
                    Severity::Risk => "risk",
                    Severity::Warning => "warning",
                    Severity::Notice => "notice",
                };
                out.push_str(&format!(
                    "     {level} [{}] {}: {}\n",
                    f.node, f.check, f.message
                ));
            }
        }
        for d in &self.drills {
            let evidence: Vec<String> = d
                .evidence
                .iter()
                .map(|(k, v)| format!("{k}={}", plain(v)))
                .collect();
            out.push_str(&format!(
                "{} {}/{} ({} ms): {}\n",
                drill_verdict(d),
                d.route,
                d.drill.as_str(),
                d.millis,
                evidence.join(" ")
            ));
            if let Some(n) = &d.note {
                out.push_str(&format!("     {n}\n"));
            }
        }
        if let Some(c) = &self.cleanup {
            out.push_str(&format!(
                "{} cleanup: {} record(s) deleted, {} left{}\n",
                verdict(c.left.is_empty()),
                c.deleted,
                c.left.len(),
                if c.left.is_empty() {
                    String::new()
                } else {
                    format!(": {}", c.left.join(", "))
                }
            ));
        }
        let failures = self.failures();
        if failures.is_empty() {
            out.push_str("all drills passed\n");
        } else {
            out.push_str(&format!("FAILED: {}\n", failures.join(", ")));
        }
        out
    }
}

/// A JSON value without quotes around strings.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(drill: Drill, pass: bool) -> Outcome {
        Outcome {
            route: "orders".into(),
            drill,
            pass,
            evidence: Map::from_iter([("effects".to_owned(), Value::from(1))]),
            note: None,
            millis: 3,
            skipped: false,
        }
    }

    #[test]
    fn a_failed_drill_is_named_and_fails_the_run() {
        let r = Report {
            mode: "config",
            setup: Map::new(),
            store: Some(StoreCheck::new("memory", Ok(vec![]))),
            drills: vec![outcome(Drill::Replay, false), outcome(Drill::Race, true)],
            cleanup: Some(Cleanup {
                deleted: 2,
                left: vec![],
            }),
            pass: true,
        }
        .finish();
        assert!(!r.pass);
        assert_eq!(r.failures(), ["orders/replay"]);
        let text = r.to_text();
        assert!(
            text.contains("FAIL orders/replay (3 ms): effects=1"),
            "{text}"
        );
        assert!(text.contains("FAILED: orders/replay"), "{text}");
        let json: Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["pass"], false);
        assert_eq!(json["drills"][0]["drill"], "replay");
    }

    #[test]
    fn a_skipped_drill_says_why_and_does_not_fail_the_run() {
        let r = Report {
            mode: "config",
            setup: Map::new(),
            store: None,
            drills: vec![
                Outcome::skipped("orders", Drill::Replay, "shadow"),
                outcome(Drill::Replay, true),
            ],
            cleanup: None,
            pass: false,
        }
        .finish();
        assert!(r.pass);
        let text = r.to_text();
        assert!(text.contains("SKIP orders/replay"), "{text}");
        assert!(text.contains("skipped: mode = shadow"), "{text}");
    }

    #[test]
    fn a_run_that_skipped_every_drill_does_not_pass() {
        let r = Report {
            mode: "config",
            setup: Map::new(),
            store: None,
            drills: vec![Outcome::skipped("orders", Drill::Replay, "shadow")],
            cleanup: None,
            pass: true,
        }
        .finish();
        assert!(!r.pass);
        assert!(
            r.to_text().contains("FAILED: nothing drilled"),
            "{}",
            r.to_text()
        );
    }

    #[test]
    fn a_risk_fails_the_store_check_and_a_warning_does_not() {
        let finding = |severity| Finding {
            severity,
            node: "n".into(),
            check: "x",
            message: "m".into(),
        };
        assert!(StoreCheck::new("redis", Ok(vec![finding(Severity::Warning)])).pass);
        assert!(!StoreCheck::new("redis", Ok(vec![finding(Severity::Risk)])).pass);
        assert!(!StoreCheck::new("redis", Err("down".into())).pass);
    }
}
