//! Dialling one Redis server. Over plain TCP the gateway dials itself: its own connection
//! ([`super::own`]) unless the near-cache needs the crate's (RESP3 pushes), whose writes
//! then coalesce (see [`crate::store::coalesce`]); TLS and Unix sockets are the redis crate's own
//! dial.

use std::net::SocketAddr;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisResult};
use tokio::net::TcpStream;

use super::con::Con;
use super::own::OwnConnection;

/// A connection, and the task that drives it when the gateway spawned that task.
pub(super) struct Dialled {
    pub(super) con: Con,
    pub(super) driver: Option<Driver>,
}

/// The task driving a connection the gateway dialled: aborted when dropped, so a
/// connection given up on (replaced, or its set-up failed) stops at once, even with
/// commands still held for a server that stopped reading, as the crate's own
/// connections do.
pub(super) struct Driver(tokio::task::AbortHandle);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A connection to `client`'s server; the crate's when `pushes` are wanted.
pub(super) async fn connect(
    client: &Client,
    config: AsyncConnectionConfig,
    pushes: bool,
) -> RedisResult<Dialled> {
    let info = client.get_connection_info();
    let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
        let con = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        return Ok(Dialled {
            con: Con::Crate(con),
            driver: None,
        });
    };
    let tcp = first_to_answer(host, *port).await?;
    tcp.set_nodelay(true)?;
    if !pushes {
        let (con, drive) = OwnConnection::new(info.redis_settings(), tcp).await?;
        return Ok(Dialled {
            con: Con::Own(con),
            driver: Some(Driver(tokio::spawn(drive).abort_handle())),
        });
    }
    let stream = crate::store::coalesce::Coalesce::new(tcp);
    let (con, driver) =
        MultiplexedConnection::new_with_config(info.redis_settings(), stream, config).await?;
    let driver = Driver(tokio::spawn(driver).abort_handle());
    Ok(Dialled {
        con: Con::Crate(con),
        driver: Some(driver),
    })
}

/// Connects to every address `host` resolves to at once and keeps the first that
/// answers, as the crate does: an address that drops packets (an IPv6 record without a
/// route, a stale record) does not hold the dial until the kernel gives up on it.
async fn first_to_answer(host: &str, port: u16) -> RedisResult<TcpStream> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    // Dropped with the dial: the attempts still pending are aborted.
    let mut attempts = tokio::task::JoinSet::new();
    for addr in addrs {
        attempts.spawn(TcpStream::connect(addr));
    }
    let mut failed = None;
    while let Some(attempt) = attempts.join_next().await {
        match attempt {
            Ok(Ok(tcp)) => return Ok(tcp),
            Ok(Err(e)) => failed = Some(e),
            Err(_) => {} // cancelled: only when the dial itself is
        }
    }
    Err(match failed {
        Some(e) => e.into(),
        None => (
            ErrorKind::Io,
            "the host resolves to no address",
            host.to_owned(),
        )
            .into(),
    })
}
