//! Real components for the integration tests: a counting upstream, redis-server processes,
//! gateways in-process and as child processes of the real binary, a typed builder for their
//! config files, the store contract every backend must pass, webhook deliveries signed and
//! judged by the providers' own libraries, Stripe's own Python client making calls, and
//! real gRPC (grpcio) servers and clients, nginx as a reference proxy, and a strict reader
//! of HTTP/1.1 on the wire.
//! Everything binds loopback port 0.

pub mod claims;
pub mod client;
pub mod cluster;
pub mod config;
pub mod contract;
pub mod fault_proxy;
pub mod fleet;
pub mod gateway;
pub mod grpc;
pub mod near_cache;
pub mod nginx;
pub mod otlp;
pub mod redis_server;
pub mod sentinel;
pub mod stripe_client;
pub mod tls;
pub mod upstream;
pub mod webhooks;
pub mod wire;

use std::time::{Duration, Instant};

pub use client::{Http, Reply};
pub use cluster::{move_slot, slot_of, start_moving_slot, RedisCluster};
pub use config::{GatewayConfig, RouteCfg, StoreCfg};
pub use gateway::{Backend, GatewayProcess, TestGateway};
pub use grpc::{GrpcCall, GrpcServer};
pub use otlp::{OtlpReceiver, ReceivedSpan};
pub use redis_server::{free_port, RedisServer, RedisTls};
pub use sentinel::{SentinelGroup, MASTER_NAME};
pub use stripe_client::{CustomerCreate, StripeClient};
pub use tls::{CertFiles, TestCa};
pub use upstream::Upstream;
pub use webhooks::{Delivery, Providers};

/// Polls `f` until it returns true or `within` passes.
pub async fn eventually<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Runs each named behaviour `async fn name(backend: Backend)` of the calling test file
/// once on the embedded store and once on Redis, as `memory::name` and `redis::name`.
#[macro_export]
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name($crate::Backend::Memory).await })*
        }
        mod redis {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name($crate::Backend::Redis).await })*
        }
    };
}
