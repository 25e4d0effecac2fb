//! A real 3-master Redis Cluster (no replicas), plain or over TLS.

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

    fn start_inner(tls: Option<&RedisTls>) -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                // The bus port is set explicitly: port + 10000 may not exist for high
                // ephemeral ports.
                let bus = free_port().to_string();
                let mut args = vec![
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    &bus,
                    "--cluster-node-timeout",
                    "2000",
                ];
                match tls {
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
