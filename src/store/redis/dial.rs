//! Dialling one Redis server: always the redis crate's multiplexed connection. Over plain
//! TCP the gateway makes the socket itself, so that the connection's writes coalesce (see
//! [`crate::store::coalesce`]); TLS and Unix sockets are the crate's own dial.

use std::net::SocketAddr;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisResult};
use tokio::net::TcpStream;

use super::links::Lane;

/// A connection, and the task that drives it when the gateway spawned that task.
pub(super) struct Dialled {
    pub(super) con: MultiplexedConnection,
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

/// A connection to `client`'s server. The crate's set-up (`AUTH`, `SELECT`, `HELLO` for
/// RESP3, `CLIENT SETINFO`) must be answered before it counts as made: a frozen server
/// (SIGSTOP) still accepts TCP.
pub(super) async fn connect(
    client: &Client,
    config: AsyncConnectionConfig,
) -> RedisResult<Dialled> {
    let info = client.get_connection_info();
    let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
        let con = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        return Ok(Dialled { con, driver: None });
    };
    let tcp = first_to_answer(host, *port).await?;
    tcp.set_nodelay(true)?;
    let stream = crate::store::coalesce::Coalesce::new(tcp);
    let (con, driver) =
        MultiplexedConnection::new_with_config(info.redis_settings(), stream, config).await?;
    let driver = Driver(tokio::spawn(driver).abort_handle());
    Ok(Dialled {
        con,
        driver: Some(driver),
    })
}
/// Names the connection after its lane. A user not allowed `CLIENT` is refused, and its
/// connection keeps no name: only a failed connection fails the dial.
pub(super) async fn name(con: &mut MultiplexedConnection, lane: Lane) -> redis::RedisResult<()> {
    let named = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(lane.client_name())
        .exec_async(con)
        .await;
    match named {
        Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() => {
            Err(e)
        }
        _ => Ok(()),
    }
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
