//! Store checks: settings of the Redis a gateway points at that quietly break the
//! guarantee (a claim evicted under memory pressure, a restart that forgets every key, a
//! replica that refuses writes, cluster slots nobody serves).
//!
//! [`findings`] is pure: it reads the replies of `CONFIG GET` and `INFO` that the Redis
//! backends collect ([`super::Store::health_findings`]) and says what is wrong with them.

use serde::Serialize;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Duplicates can slip through while the gateway runs: `drill` fails on it.
    Risk,
    /// The guarantee holds while Redis runs but not across everything (a restart), or the
    /// gateway could not tell: printed and logged, not a failure.
    Warning,
    /// Costs Redis memory or CPU, not the guarantee: printed, and logged at info.
    Notice,
}

/// One thing wrong with the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// How bad.
    pub severity: Severity,
    /// Which node (`host:port`), or `cluster`.
    pub node: String,
    /// Which setting: `maxmemory-policy`, `persistence`, `role`, `cluster-slots`, `config`,
    /// `hash-max-listpack-value`.
    pub check: &'static str,
    /// What is wrong and what it costs.
    pub message: String,
}

/// What one Redis node answered. `None`: the node refused the command (managed Redis
/// services often rename or forbid `CONFIG`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeReplies {
    /// `host:port`.
    pub node: String,
    /// `CONFIG GET maxmemory-policy`.
    pub maxmemory_policy: Option<String>,
    /// `CONFIG GET appendonly`.
    pub appendonly: Option<String>,
    /// `CONFIG GET save` (empty: no snapshots).
    pub save: Option<String>,
    /// `CONFIG GET hash-max-listpack-value` (`hash-max-ziplist-value` before Redis 7).
    pub hash_max_listpack_value: Option<String>,
    /// `INFO replication`, as text.
    pub replication: Option<String>,
    /// `INFO server`, as text: which server and version.
    pub server: Option<String>,
}

impl NodeReplies {
    /// The server and its version as `INFO server` tells them: `Valkey 8.1.1`, `Redis
    /// 7.0.15`; `None` when it did not answer.
    pub fn version(&self) -> Option<String> {
        let info = self.server.as_deref()?;
        match info_field(info, "valkey_version") {
            Some(v) => Some(format!("Valkey {}", v.trim())),
            None => info_field(info, "redis_version").map(|v| format!("Redis {}", v.trim())),
        }
    }

    /// Whether the server has `SET ... IFEQ` (Valkey 8.1, Redis 8.4 and later), by its
    /// version: completions then run no Lua. `None` when the version is unknown. (The
    /// gateway learns it again on each connection from the first completion.)
    pub fn compares(&self) -> Option<bool> {
        let info = self.server.as_deref()?;
        let at_least = |v: &str, want: (u32, u32)| {
            let mut parts = v.trim().split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= want
        };
        match info_field(info, "valkey_version") {
            Some(v) => Some(at_least(v, (8, 1))),
            None => info_field(info, "redis_version").map(|v| at_least(v, (8, 4))),
        }
    }
}

/// The reply of `CLUSTER INFO`, as text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterReplies {
    /// `CLUSTER INFO`.
    pub info: String,
}

/// The `hash-max-listpack-value` below which a small stored response (its headers included)
/// no longer fits an ordered route's record (a hash) in its compact encoding.
const LISTPACK_VALUE_ADVISED: u64 = 1024;

/// Every slot a cluster has.
const CLUSTER_SLOTS: u64 = 16384;

/// The value of `field:` in `INFO`-style text.
fn info_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        l.trim_end_matches('\r')
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}

/// What is wrong with these nodes (and this cluster, if it is one). Empty: nothing found.
pub fn findings(nodes: &[NodeReplies], cluster: Option<&ClusterReplies>) -> Vec<Finding> {
    let mut out = Vec::new();
    for n in nodes {
        let mut finding = |severity, check, message: String| {
            out.push(Finding {
                severity,
                node: n.node.clone(),
                check,
                message,
            })
        };
        match n.maxmemory_policy.as_deref() {
            Some("noeviction") => {}
            Some(policy) => finding(
                Severity::Risk,
                "maxmemory-policy",
                format!(
                    "maxmemory-policy is {policy}: under memory pressure Redis evicts live claims and stored responses, and their retries execute again; set noeviction"
                ),
            ),
            None => finding(
                Severity::Warning,
                "config",
                "CONFIG GET is refused: check by hand that maxmemory-policy is noeviction and persistence is on".into(),
            ),
        }
        if let (Some(aof), Some(save)) = (n.appendonly.as_deref(), n.save.as_deref()) {
            if aof == "no" && save.trim().is_empty() {
                finding(
                    Severity::Warning,
                    "persistence",
                    "persistence is off (appendonly no, no snapshots): a Redis restart forgets every key, and retries after it execute again; set appendonly yes".into(),
                );
            }
        }
        let listpack: Option<u64> = n
            .hash_max_listpack_value
            .as_deref()
            .and_then(|v| v.parse().ok());
        if let Some(v) = listpack.filter(|v| *v < LISTPACK_VALUE_ADVISED) {
            finding(
                Severity::Notice,
                "hash-max-listpack-value",
                format!(
                    "hash-max-listpack-value (hash-max-ziplist-value before Redis 7) is {v}: an ordered route's record (a hash) whose stored response (headers included) is longer is kept as a hash table, about twice the memory of the compact encoding and more Redis CPU per completion; with ordered routes, set it to {LISTPACK_VALUE_ADVISED} or to above your typical response"
                ),
            );
        }
        if let Some(repl) = n.replication.as_deref() {
            if let Some(role) = info_field(repl, "role") {
                if role != "master" {
                    finding(
                        Severity::Risk,
                        "role",
                        format!(
                            "the node is a {role} (read-only): every claim fails; point the gateway at the primary"
                        ),
                    );
                }
            }
        }
    }
    if let Some(c) = cluster {
        let state = info_field(&c.info, "cluster_state").unwrap_or("unknown");
        let ok: Option<u64> = info_field(&c.info, "cluster_slots_ok").and_then(|v| v.parse().ok());
        if state != "ok" || ok != Some(CLUSTER_SLOTS) {
            out.push(Finding {
                severity: Severity::Risk,
                node: "cluster".into(),
                check: "cluster-slots",
                message: format!(
                    "cluster_state is {state}, {} of {CLUSTER_SLOTS} slots served: keys in the other slots cannot be claimed",
                    ok.map_or("an unknown number".to_owned(), |n| n.to_string())
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> NodeReplies {
        NodeReplies {
            node: "127.0.0.1:6379".into(),
            maxmemory_policy: Some("noeviction".into()),
            appendonly: Some("yes".into()),
            save: Some("3600 1 300 100 60 10000".into()),
            hash_max_listpack_value: Some("1024".into()),
            replication: Some("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n".into()),
            server: Some("# Server\r\nredis_version:7.0.15\r\n".into()),
        }
    }

    #[test]
    fn the_version_and_compare_and_set_are_read_from_info_server() {
        let n = healthy();
        assert_eq!(n.version().as_deref(), Some("Redis 7.0.15"));
        assert_eq!(n.compares(), Some(false));
        let on = |info: &str| NodeReplies {
            server: Some(info.into()),
            ..healthy()
        };
        let valkey = on("redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\n");
        assert_eq!(valkey.version().as_deref(), Some("Valkey 8.1.1"));
        assert_eq!(valkey.compares(), Some(true));
        assert_eq!(on("valkey_version:8.0.2\r\n").compares(), Some(false));
        assert_eq!(on("redis_version:8.4.0\r\n").compares(), Some(true));
        assert_eq!(on("redis_version:8.2.1\r\n").compares(), Some(false));
        let unknown = NodeReplies {
            server: None,
            ..healthy()
        };
        assert_eq!((unknown.version(), unknown.compares()), (None, None));
    }

    fn checks(f: &[Finding]) -> Vec<(&'static str, Severity)> {
        f.iter().map(|f| (f.check, f.severity)).collect()
    }

    #[test]
    fn a_healthy_node_has_no_findings() {
        assert!(findings(&[healthy()], None).is_empty());
        // Snapshots alone are persistence too.
        let n = NodeReplies {
            appendonly: Some("no".into()),
            ..healthy()
        };
        assert!(findings(&[n], None).is_empty());
    }

    #[test]
    fn an_evicting_policy_is_a_risk() {
        let n = NodeReplies {
            maxmemory_policy: Some("allkeys-lru".into()),
            ..healthy()
        };
        let f = findings(&[n], None);
        assert_eq!(checks(&f), [("maxmemory-policy", Severity::Risk)]);
        assert!(f[0].message.contains("allkeys-lru"), "{f:?}");
        assert_eq!(f[0].node, "127.0.0.1:6379");
    }

    #[test]
    fn no_persistence_is_a_warning() {
        let n = NodeReplies {
            appendonly: Some("no".into()),
            save: Some(String::new()),
            ..healthy()
        };
        assert_eq!(
            checks(&findings(&[n], None)),
            [("persistence", Severity::Warning)]
        );
    }

    #[test]
    fn a_small_listpack_value_is_a_notice() {
        let n = NodeReplies {
            hash_max_listpack_value: Some("64".into()),
            ..healthy()
        };
        let f = findings(&[n], None);
        assert_eq!(checks(&f), [("hash-max-listpack-value", Severity::Notice)]);
        assert!(f[0].message.contains("is 64"), "{f:?}");
        // Unknown (CONFIG refused) or large enough: nothing to say.
        for v in [None, Some("4096".to_owned())] {
            let n = NodeReplies {
                hash_max_listpack_value: v,
                ..healthy()
            };
            assert!(findings(&[n], None).is_empty());
        }
    }

    #[test]
    fn a_replica_is_a_risk() {
        let n = NodeReplies {
            replication: Some("# Replication\r\nrole:slave\r\nmaster_host:10.0.0.1\r\n".into()),
            ..healthy()
        };
        let f = findings(&[n], None);
        assert_eq!(checks(&f), [("role", Severity::Risk)]);
        assert!(f[0].message.contains("slave"), "{f:?}");
    }

    #[test]
    fn a_refused_config_get_is_a_warning_not_a_guess() {
        let n = NodeReplies {
            maxmemory_policy: None,
            appendonly: None,
            save: None,
            hash_max_listpack_value: None,
            ..healthy()
        };
        assert_eq!(
            checks(&findings(&[n], None)),
            [("config", Severity::Warning)]
        );
    }

    #[test]
    fn uncovered_cluster_slots_are_a_risk() {
        let ok = ClusterReplies {
            info: "cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:16384\r\n"
                .into(),
        };
        assert!(findings(&[healthy()], Some(&ok)).is_empty());
        let partial = ClusterReplies {
            info:
                "cluster_state:fail\r\ncluster_slots_assigned:10923\r\ncluster_slots_ok:10923\r\n"
                    .into(),
        };
        let f = findings(&[healthy()], Some(&partial));
        assert_eq!(checks(&f), [("cluster-slots", Severity::Risk)]);
        assert!(f[0].message.contains("10923 of 16384"), "{f:?}");
    }
}
