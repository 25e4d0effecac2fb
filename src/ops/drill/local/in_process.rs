//! Serving the drill's gateway in this process, on a loopback port.

use tokio::net::TcpListener;

use super::DrillError;
use crate::edge::server::{serve, Listeners};
use crate::edge::Gateway;

/// Serves `gateway` in this process on a loopback port: its address, the sender that
/// stops it, and its task.
pub(super) async fn start_gateway(
    gateway: std::sync::Arc<Gateway>,
) -> Result<
    (
        std::net::SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    DrillError,
> {
    let public = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(DrillError::Bind)?;
    let addr = public.local_addr().map_err(DrillError::Bind)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(serve(
        gateway,
        // The drill talks plain HTTP on loopback, whatever the user's listener speaks.
        Listeners {
            public,
            admin: None,
            tls: None,
        },
        async move {
            let _ = stopped.await;
        },
    ));
    Ok((addr, stop, served))
}
