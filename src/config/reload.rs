//! What a reload (SIGHUP) may change in a running gateway, and what waits for a restart:
//! a pure comparison of the old and the new configuration.

use crate::config::Config;

/// Merges a newly loaded configuration into the running one: everything that a running
/// gateway can apply is taken from `new`; listeners and the store stay as they are (they
/// are bound and connected). Returns the merged configuration and the names of the
/// settings that changed but only take effect after a restart.
pub fn merge(old: &Config, mut new: Config) -> (Config, Vec<&'static str>) {
    let mut restart = Vec::new();
    if old.server.listen != new.server.listen {
        restart.push("server.listen");
    }
    if old.admin.as_ref().map(|a| a.listen) != new.admin.as_ref().map(|a| a.listen) {
        restart.push("admin.listen");
    }
    if old.store != new.store {
        restart.push("store");
    }
    let (o, n) = (&old.server, &new.server);
    if o.max_header_bytes != n.max_header_bytes
        || o.header_read_timeout != n.header_read_timeout
        || o.max_connections != n.max_connections
        || o.max_concurrent_streams != n.max_concurrent_streams
        || o.write_timeout != n.write_timeout
    {
        restart.push("server connection limits (max_header_bytes, header_read_timeout, write_timeout, max_connections, max_concurrent_streams)");
    }
    if old.admin.as_ref().map(|a| a.max_connections)
        != new.admin.as_ref().map(|a| a.max_connections)
    {
        restart.push("admin.max_connections");
    }
    // A new certificate is applied (see `server`); switching TLS on or off is not.
    if o.tls.is_some() != n.tls.is_some() {
        restart.push("server.tls (on or off)");
    }
    if o.shutdown_grace != n.shutdown_grace {
        restart.push("server.shutdown_grace");
    }
    // The connection workers are set up once, at start.
    if o.workers != n.workers {
        restart.push("server.workers");
    }
    // The exporter and the tracing layer are set up once, at start.
    if old.telemetry != new.telemetry {
        restart.push("telemetry");
    }
    new.telemetry = old.telemetry.clone();
    // Keep what needs a restart as it is, so the admin port and metrics tell the truth.
    new.server.listen = old.server.listen;
    new.store = old.store.clone();
    match (new.admin.as_mut(), old.admin.as_ref()) {
        (Some(new), Some(old)) => {
            new.listen = old.listen;
            // A file that moved the admin port to loopback and dropped its token was
            // validated for loopback; the port stays where it is bound until a restart.
            if new.is_open() && !new.allow_unauthenticated {
                new.token = old.token.clone();
            }
        }
        // The admin listener stays bound until a restart: keep guarding it with the old
        // token rather than leave it open.
        (None, Some(old)) => new.admin = Some(old.clone()),
        _ => {}
    }
    (new, restart)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra_server: &str, rest: &str) -> Config {
        Config::from_toml(&format!(
            "[server]\nlisten = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:9000\"\n{extra_server}\n{rest}"
        ))
        .unwrap()
    }

    #[test]
    fn traces_switched_on_or_moved_wait_for_a_restart() {
        let off = config("", "");
        let on = config(
            "",
            "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\n",
        );
        let (merged, restart) = merge(&off, on.clone());
        assert_eq!(restart, ["telemetry"]);
        assert_eq!(
            merged.telemetry, None,
            "the running exporter stays as it was"
        );
        let (merged, restart) = merge(&on, on.clone());
        assert!(restart.is_empty());
        assert_eq!(merged.telemetry, on.telemetry);
    }

    #[test]
    fn a_new_worker_count_waits_for_a_restart() {
        let (_, restart) = merge(&config("", ""), config("workers = 3", ""));
        assert_eq!(restart, ["server.workers"]);
        let (_, restart) = merge(&config("workers = 3", ""), config("workers = 3", ""));
        assert!(restart.is_empty());
    }

    #[test]
    fn routes_apply_and_listeners_wait_for_a_restart() {
        let old = config(
            "",
            "[admin]\nlisten = \"127.0.0.1:9901\"\ntoken = \"old\"\n",
        );
        let new = Config::from_toml(
            "[server]\nlisten = \"127.0.0.1:8081\"\nupstream = \"http://127.0.0.1:9000\"\n\
             [[routes]]\nname = \"p\"\nmethods = [\"POST\"]\npath = \"/p\"\nkey = { header = \"Idempotency-Key\" }\nscope = []\n",
        )
        .unwrap();
        let (merged, restart) = merge(&old, new);
        assert_eq!(merged.routes.len(), 1);
        assert_eq!(merged.server.listen, old.server.listen);
        assert!(restart.contains(&"server.listen"));
        assert!(restart.contains(&"admin.listen"));
        // A file that drops [admin] keeps guarding the bound admin port with the old token.
        assert_eq!(
            merged.admin.as_ref().and_then(|a| a.token.as_deref()),
            Some("old")
        );
    }

    #[test]
    fn an_admin_port_bound_beyond_loopback_keeps_its_token_until_a_restart() {
        let old = config("", "[admin]\nlisten = \"0.0.0.0:9901\"\ntoken = \"old\"\n");
        let new = config("", "[admin]\nlisten = \"127.0.0.1:9901\"\n");
        let (merged, restart) = merge(&old, new);
        assert!(restart.contains(&"admin.listen"));
        let admin = merged.admin.unwrap();
        assert_eq!(admin.listen, old.admin.unwrap().listen);
        assert_eq!(admin.token.as_deref(), Some("old"));
    }

    #[test]
    fn an_unchanged_file_needs_no_restart() {
        let old = config("max_connections = 10", "");
        let (_, restart) = merge(&old, old.clone());
        assert!(restart.is_empty(), "{restart:?}");
    }
}
