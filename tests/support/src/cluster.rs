//! A real 3-master Redis Cluster (no replicas), plain or over TLS, and the changes an
//! operator makes to one: a new node joins, a slot moves, a replica takes over.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::redis_server::{free_port, RedisServer, RedisTls};

/// Three masters created with `redis-cli --cluster create`; the servers end with it.
pub struct RedisCluster {
    /// The masters.
    pub nodes: Vec<RedisServer>,
    /// Set for a cluster started with [`RedisCluster::start_tls`].
    tls: Option<RedisTls>,
}

impl RedisCluster {
    /// A plaintext cluster.
    pub fn start() -> Self {
        Self::start_inner(None)
    }

    /// A cluster that speaks TLS to clients (`rediss://` on each node's TLS port) and on
    /// its bus (`tls-cluster yes`, `tls-replication yes`), with `tls`'s certificate and CA.
    /// Each node keeps a plaintext port for the harness's own commands; a TLS client is
    /// told TLS ports in slot maps and redirects, so a gateway that reaches the cluster at
    /// all does so over TLS.
    pub fn start_tls(tls: &RedisTls) -> Self {
        Self::start_inner(Some(tls))
    }

    /// A plaintext cluster of Valkey nodes (see [`RedisServer::start_valkey`]).
    pub fn start_valkey() -> Self {
        Self::start_nodes(None, true)
    }

    fn start_inner(tls: Option<&RedisTls>) -> Self {
        Self::start_nodes(tls, false)
    }

    fn start_nodes(tls: Option<&RedisTls>, valkey: bool) -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                let bus = free_port().to_string();
                let mut args = node_args(&bus);
                match tls {
                    None if valkey => RedisServer::start_valkey(&args),
                    Some(tls) => {
                        args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
                        RedisServer::start_tls(tls, &args)
                    }
                    None => RedisServer::start_with(&args),
                }
            })
            .collect();
        let mut create = Command::new("redis-cli");
        let addrs: Vec<String> = match tls {
            Some(tls) => {
                create.arg("--tls").arg("--cacert").arg(&tls.ca_file);
                if tls.require_client_cert {
                    create
                        .arg("--cert")
                        .arg(&tls.server.cert)
                        .arg("--key")
                        .arg(&tls.server.key);
                }
                nodes
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.tls_port.unwrap()))
                    .collect()
            }
            None => nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port))
                .collect(),
        };
        let out = create
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli not installed");
        assert!(
            out.status.success(),
            "cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            loop {
                let info: String = n.cmd(&["CLUSTER", "INFO"]);
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster never became ok: {info}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Self {
            nodes,
            tls: tls.cloned(),
        }
    }

    /// Seed URLs for `store.urls`: `redis://` or, for a TLS cluster, `rediss://`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| match self.tls {
                Some(_) => n.tls_url(),
                None => n.url(),
            })
            .collect()
    }
}

/// A cluster node's arguments, with its bus port set explicitly: port + 10000 may not
/// exist for high ephemeral ports.
fn node_args(bus: &str) -> Vec<&str> {
    vec![
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-port",
        bus,
        "--cluster-node-timeout",
        "2000",
    ]
}

impl RedisCluster {
    /// A fourth node, met through `master`, known to every node as a master with no slots.
    /// It stays a master when it gives its last slot away (no replica migration). It has
    /// never run a script.
    pub fn join_a_new_node(&self, master: &RedisServer) -> RedisServer {
        let bus = free_port().to_string();
        let mut args = node_args(&bus);
        args.extend(["--cluster-allow-replica-migration", "no"]);
        let node = RedisServer::start_with(&args);
        // The bus port is not port + 10000 here: the master's own line names it
        // (`ip:port@bus`).
        let me: String = master.cmd(&["CLUSTER", "NODES"]);
        let master_bus = me
            .lines()
            .find(|l| l.contains("myself"))
            .and_then(|l| l.split(' ').nth(1)?.split('@').nth(1)?.split(',').next())
            .expect("CLUSTER NODES names the bus port")
            .to_owned();
        let _: () = node.cmd(&[
            "CLUSTER",
            "MEET",
            "127.0.0.1",
            &master.port.to_string(),
            &master_bus,
        ]);
        let id: String = node.cmd(&["CLUSTER", "MYID"]);
        wait("known to every node", &|| {
            self.nodes.iter().all(|n| {
                let nodes: String = n.cmd(&["CLUSTER", "NODES"]);
                nodes.lines().any(|l| l.starts_with(&id))
            })
        });
        wait("sees every slot covered", &|| {
            let info: String = node.cmd(&["CLUSTER", "INFO"]);
            info.contains("cluster_state:ok")
        });
        node
    }

    /// A fourth node joins as a replica of `master` and takes its place by a manual
    /// failover: the slots it owned now belong to a node no client has seen.
    pub fn fail_over_to_a_new_node(&self, master: &RedisServer) -> RedisServer {
        let replica = self.join_a_new_node(master);
        let master_id: String = master.cmd(&["CLUSTER", "MYID"]);
        let _: () = replica.cmd(&["CLUSTER", "REPLICATE", &master_id]);
        wait("synced", &|| {
            let info: String = replica.cmd(&["INFO", "replication"]);
            info.contains("master_link_status:up")
        });
        let _: () = replica.cmd(&["CLUSTER", "FAILOVER"]);
        wait("took over", &|| {
            let role: Vec<redis::Value> = replica.cmd(&["ROLE"]);
            matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master")
        });
        wait("every node agrees", &|| {
            self.nodes.iter().all(|n| {
                let nodes: String = n.cmd(&["CLUSTER", "NODES"]);
                nodes
                    .lines()
                    .any(|l| l.starts_with(&master_id) && l.contains("slave"))
            })
        });
        replica
    }
}

/// Waits (blocking) until `done`, or panics naming `what` after 20s.
fn wait(what: &str, done: &dyn Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "never {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Moves `slot`, holding `keys`, from `from` to `to`: importing, migrating, the keys
/// moved, then every node in `every` (and both ends) told the new owner.
pub fn move_slot(
    every: &[&RedisServer],
    slot: &str,
    keys: &[&str],
    from: &RedisServer,
    to: &RedisServer,
) {
    start_moving_slot(slot, keys, from, to);
    let to_id: String = to.cmd(&["CLUSTER", "MYID"]);
    for n in [to, from].into_iter().chain(every.iter().copied()) {
        let _: () = n.cmd(&["CLUSTER", "SETSLOT", slot, "NODE", &to_id]);
    }
}

/// The first half of [`move_slot`]: `to` importing, `from` migrating, `keys` moved (none
/// is fine); the slot still belongs to `from` in every node's `CLUSTER SLOTS`, and a key
/// `from` lacks is reached on `to` through an `ASK` redirect.
pub fn start_moving_slot(slot: &str, keys: &[&str], from: &RedisServer, to: &RedisServer) {
    let from_id: String = from.cmd(&["CLUSTER", "MYID"]);
    let to_id: String = to.cmd(&["CLUSTER", "MYID"]);
    let _: () = to.cmd(&["CLUSTER", "SETSLOT", slot, "IMPORTING", &from_id]);
    let _: () = from.cmd(&["CLUSTER", "SETSLOT", slot, "MIGRATING", &to_id]);
    if keys.is_empty() {
        return;
    }
    let port = to.port.to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
    migrate.extend_from_slice(keys);
    let moved: String = from.cmd(&migrate);
    assert_eq!(moved, "OK");
}

/// The cluster slot of `key` (CRC16/XMODEM of its hash tag, or of the whole key), as
/// `CLUSTER KEYSLOT` answers: computed here so a test can look for a key in a given slot
/// without a round trip per candidate.
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = key
        .find('{')
        .and_then(|open| {
            let close = key[open + 1..].find('}')? + open + 1;
            (close > open + 1).then(|| &bytes[open + 1..close])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}
