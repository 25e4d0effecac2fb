//! A Redis Sentinel deployment of real processes: one primary, one replica, one sentinel.

use std::time::{Duration, Instant};

use crate::redis_server::RedisServer;

/// The name the sentinel monitors the primary under.
pub const MASTER_NAME: &str = "mymaster";

/// One primary, one replica of it (`--replicaof`) and one sentinel watching them, ready
/// (the replica in sync, the sentinel aware of it) when [`SentinelGroup::start`] returns.
pub struct SentinelGroup {
    /// The primary the group started with.
    pub primary: RedisServer,
    /// Its replica, promoted by a failover.
    pub replica: RedisServer,
    /// The sentinel.
    pub sentinel: RedisServer,
}

/// Polls `f` every 50ms until it holds, panicking with `what` after `within`.
fn wait_until(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl SentinelGroup {
    /// Starts the three processes and waits until a failover could promote the replica.
    pub fn start() -> Self {
        let primary = RedisServer::start();
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
        wait_until(Duration::from_secs(10), "the replica never synced", || {
            let info: String = replica.cmd(&["INFO", "replication"]);
            info.contains("master_link_status:up")
        });
        let sentinel = RedisServer::start_sentinel(MASTER_NAME, primary.port, &[]);
        let group = Self {
            primary,
            replica,
            sentinel,
        };
        let replica_port = group.replica.port.to_string();
        wait_until(
            Duration::from_secs(15),
            "the sentinel never saw the replica",
            || {
                let replicas: Vec<std::collections::HashMap<String, String>> =
                    group.sentinel.cmd(&["SENTINEL", "REPLICAS", MASTER_NAME]);
                // Connected to it (flags exactly "slave", no "disconnected") and seeing its
                // link to the primary up: otherwise a failover finds no good replica.
                replicas.iter().any(|r| {
                    r.get("port") == Some(&replica_port)
                        && r.get("flags").map(String::as_str) == Some("slave")
                        && r.get("master-link-status").map(String::as_str) == Some("ok")
                })
            },
        );
        group
    }

    /// The sentinel URLs for `store.sentinels`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        vec![self.sentinel.url()]
    }

    /// The port of the node the sentinel names as primary now.
    pub fn primary_port(&self) -> u16 {
        let addr: Vec<String> =
            self.sentinel
                .cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]);
        addr[1].parse().unwrap()
    }

    /// Waits until the sentinel names the replica as primary and the replica agrees.
    /// Queries may fail meanwhile: a failover kills the nodes' client connections.
    pub fn wait_for_promotion(&self, within: Duration) {
        wait_until(within, "the sentinel never promoted the replica", || {
            let named = self.sentinel.connection().and_then(|mut c| {
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(MASTER_NAME)
                    .query::<(String, u16)>(&mut c)
            });
            let role = self.replica.connection().and_then(|mut c| {
                redis::cmd("INFO")
                    .arg("replication")
                    .query::<String>(&mut c)
            });
            named.is_ok_and(|(_, port)| port == self.replica.port)
                && role.is_ok_and(|r| r.contains("role:master"))
        });
    }
}

impl SentinelGroup {
    /// `SENTINEL FAILOVER`: promotes the replica while the primary lives on (it is demoted
    /// to a replica). Retried while the sentinel still finds no replica good enough.
    pub fn force_failover(&self) {
        wait_until(
            Duration::from_secs(15),
            "the sentinel refused to fail over",
            || {
                let mut c = self.sentinel.connection().unwrap();
                redis::cmd("SENTINEL")
                    .arg("FAILOVER")
                    .arg(MASTER_NAME)
                    .query::<String>(&mut c)
                    .is_ok()
            },
        );
    }
}
