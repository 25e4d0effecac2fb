//! `check --store`: the configured store dialled and authenticated as the gateway would,
//! with what each node is (server, version, whether it compares and sets natively) and the
//! store checks `drill` makes (an evicting policy, no persistence, a replica, uncovered
//! slots). A configuration whose store cannot be reached, or that a risk makes unsafe,
//! does not pass.

use std::fmt::Write;
use std::time::Duration;

use crate::config::Config;
use crate::store::health::{Finding, Severity};
use crate::store::Store;

/// What `check --store` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreVerdict {
    /// Reached, and nothing found that lets a duplicate through.
    Passed,
    /// Reached, with a risk: duplicates can slip through while the gateway runs.
    Risky,
    /// Not reached, or it refused the gateway's credentials.
    Unreachable,
}

/// The configured store checked: the text to print, and the verdict.
pub async fn check_store(config: &Config) -> (String, StoreVerdict) {
    let mut out = String::new();
    let backend = config.store.backend.kind().as_str();
    let store = match Store::from_config(&config.store) {
        Ok(store) => store,
        Err(e) => {
            let _ = writeln!(out, "store ({backend}): cannot be set up: {e}");
            return (out, StoreVerdict::Unreachable);
        }
    };
    // The store's own timeout for each question, and a dial; at least two seconds.
    let patience = (config.store.timeout * 4).max(Duration::from_secs(2));
    let (nodes, findings) = match tokio::time::timeout(patience, store.health()).await {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => {
            let _ = writeln!(out, "store ({backend}): not reached: {e}");
            return (out, StoreVerdict::Unreachable);
        }
        Err(_) => {
            let _ = writeln!(out, "store ({backend}): no answer within {patience:?}");
            return (out, StoreVerdict::Unreachable);
        }
    };
    let _ = writeln!(out, "store ({backend}): reached");
    for node in &nodes {
        let version = node.version().unwrap_or_else(|| "version not told".into());
        let compares = match node.compares() {
            Some(true) => "SET ... IFEQ: yes (completions run no Lua)",
            Some(false) => "SET ... IFEQ: no (completions run a script)",
            None => "SET ... IFEQ: unknown",
        };
        let _ = writeln!(out, "  {}: {version}; {compares}", node.node);
    }
    for Finding {
        severity,
        node,
        check,
        message,
    } in &findings
    {
        let severity = match severity {
            Severity::Risk => "risk",
            Severity::Warning => "warning",
            Severity::Notice => "notice",
        };
        let _ = writeln!(out, "  {severity}: {node} {check}: {message}");
    }
    let risky = findings.iter().any(|f| f.severity == Severity::Risk);
    (
        out,
        if risky {
            StoreVerdict::Risky
        } else {
            StoreVerdict::Passed
        },
    )
}
