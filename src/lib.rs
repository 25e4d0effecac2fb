//! dedupe-gateway: a reverse proxy that makes retried HTTP writes safe.
//!
//! # Where a request goes
//!
//! ```text
//!  edge::server ──▶ edge::Gateway::handle ──▶ edge::framing check ──▶ protocol::route::find
//!                                                          │
//!            no route, or no optional key ◀────────────────┤
//!            edge::passthrough (streamed)                  │ a route
//!                                                          ▼
//!                           body read (bounded) ─▶ Route::verdict: key, scope, hash, store key
//!                           (a signed route checks the signature first: 401 if it fails)
//!                                                          │
//!                                                          ▼  (a tracked task from here)
//!                         dedupe::run ─▶ store::Store::claim (one atomic operation)
//!                         │ Won(Lease) ─▶ edge::forwarder ─▶ upstream ─▶ lease.complete / release / keep
//!                         │ Replay ─────▶ edge::replay (record, checked against its key)
//!                         └ Conflict 409 / Mismatch 422 / store error (on_error)
//!                                                          │
//!       edge::problem (errors → problem+json) ◀────────────┘ ─▶ access record (log + metrics)
//! ```
//!
//! # The layers, lowest first (no module imports one listed after it; tests aside)
//!
//! - [`protocol`]: the protocol's pure parts: the values a claim is made of, keys,
//!   fingerprints and request paths, routes and their policies, stored records and their
//!   sealing, webhook signatures, gRPC's rules, and what a proxy does to framing and
//!   hop-by-hop fields between its two sides. No I/O.
//! - [`config`]: the TOML file, validated into a [`config::Config`] before anything binds;
//!   the files, certificates and keys it names; what a SIGHUP may change.
//! - [`runtime`]: the runtimes the gateway runs on (the multi-threaded one and a
//!   connection worker per CPU), and what is kept per runtime: clients, links, timers.
//! - [`store`]: the store contract and its backends (memory, Redis, Redis Cluster,
//!   Sentinel), the near-cache.
//! - [`telemetry`]: the log, Prometheus metrics and traces.
//! - [`dedupe`]: the protocol run over a store (claim, wait, lease, settle), with no HTTP
//!   types.
//! - [`upstream`]: hyper-util's pooled upstream clients, the one upstream call and its
//!   typed failures, and the proxy hop's request rules.
//! - [`edge`]: the hyper edge: listeners and connections (server/), the smuggling guard,
//!   gateway state, the request pipeline, passthrough, the forwarder, replays, the access
//!   record, the admin port (admin/), and the one place errors become responses
//!   (problem/).
//! - [`ops`]: the commands an operator runs besides `run`: `check`, `drill` and `keys`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod dedupe;
pub mod edge;
pub mod ops;
pub mod protocol;
pub mod runtime;
pub mod store;
pub mod telemetry;
pub mod upstream;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

/// Boxed error of a response body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every request sent upstream and every response sent to a client.
pub type Body = BoxBody<Bytes, BoxError>;

/// A body holding the given bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

#[cfg(test)]
mod layout_tests {
    /// The book's layout page (docs/layout.md) names every module this file declares, and
    /// the module map above names them in the same order.
    #[test]
    fn book_layout_and_module_map_match_the_modules() {
        let lib = include_str!("lib.rs");
        let book = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/layout.md"));
        let layout = book
            .split("# Layout\n")
            .nth(1)
            .expect("docs/layout.md has a Layout heading");
        let modules: Vec<&str> = lib
            .lines()
            .filter_map(|l| l.strip_prefix("pub mod "))
            .map(|l| l.trim_end_matches(';'))
            .collect();
        assert!(modules.len() > 5, "{modules:?}");
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for m in &modules {
            assert!(
                layout.contains(&format!("src/{m}/")),
                "docs/layout.md misses layer {m}"
            );
            // Each module of a layer is named: by its path, or by its file in the
            // layer's line.
            let layer = std::fs::read_to_string(src.join(m).join("mod.rs")).unwrap();
            for child in layer.lines().filter_map(|l| {
                l.trim_start_matches("pub ")
                    .trim_start_matches("pub(crate) ")
                    .strip_prefix("mod ")
                    .and_then(|c| c.strip_suffix(';'))
            }) {
                if child == "tests" {
                    continue;
                }
                assert!(
                    layout.contains(&format!("src/{m}/{child}"))
                        || layout.contains(&format!("{child}.rs"))
                        || layout.contains(&format!("{child}/")),
                    "docs/layout.md misses module {m}::{child}"
                );
            }
            assert!(
                lib.contains(&format!("//! - [`{m}`]")),
                "the module map in lib.rs misses {m}"
            );
        }
    }

    /// The module order of the map above, lowest first.
    fn module_order() -> Vec<String> {
        include_str!("lib.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! - [`"))
            .filter_map(|l| l.split_once('`').map(|(m, _)| m.to_owned()))
            .collect()
    }

    /// The `crate::NAME` paths a source text uses outside its tests.
    fn crate_paths(text: &str) -> Vec<String> {
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut found = Vec::new();
        for line in code.lines() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            let mut rest = line;
            while let Some(i) = rest.find("crate::") {
                let after = &rest[i + "crate::".len()..];
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                // `crate::{a, b}` imports: every name in the braces.
                if name.is_empty() && after.starts_with('{') {
                    let inner = after[1..].split('}').next().unwrap_or_default();
                    found.extend(
                        inner
                            .split(',')
                            .filter_map(|n| n.trim().split("::").next())
                            .map(str::to_owned),
                    );
                } else {
                    found.push(name);
                }
                rest = after;
            }
        }
        found
    }

    /// No module imports one listed after it in the map (tests aside): every file under
    /// `src/<module>` and `src/<module>.rs` is read for `crate::` paths.
    #[test]
    fn no_module_imports_a_module_listed_after_it() {
        let order = module_order();
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut upward = Vec::new();
        for (rank, module) in order.iter().enumerate() {
            let mut files = vec![src.join(format!("{module}.rs"))];
            let mut dirs = vec![src.join(module)];
            while let Some(dir) = dirs.pop() {
                for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let path = entry.path();
                    if path.is_dir() && !path.ends_with("tests") {
                        dirs.push(path);
                    } else if path.extension().is_some_and(|e| e == "rs")
                        && !path.ends_with("tests.rs")
                    {
                        files.push(path);
                    }
                }
            }
            for file in files.iter().filter(|f| f.exists()) {
                let text = std::fs::read_to_string(file).unwrap();
                for used in crate_paths(&text) {
                    if let Some(r) = order.iter().position(|m| *m == used) {
                        if r > rank {
                            upward.push(format!("{} uses crate::{used}", file.display()));
                        }
                    }
                }
            }
        }
        assert!(
            upward.is_empty(),
            "imports running upward:\n{}",
            upward.join("\n")
        );
    }

    #[test]
    fn crate_paths_are_found_in_uses_braces_and_expressions() {
        let text = "use crate::a::B;\nuse crate::{b, c::D};\nlet x = crate::d::f();\n// crate::e\n#[cfg(test)]\nuse crate::z;";
        assert_eq!(crate_paths(text), ["a", "b", "c", "d"]);
    }
}
