//! A TCP proxy between a gateway and Redis that passes bytes, or misbehaves the way
//! networks do: loses flows silently (TCP stays up, bytes vanish, as behind a NAT that
//! forgot the flow), holds new connections unanswered, cuts every open connection,
//! garbles what the server sends next on the open ones, or holds still what chosen flows
//! send to the server.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

struct Shared {
    target: SocketAddr,
    accepted: AtomicU64,
    /// Flows numbered below this are lost: their bytes are read and dropped, both ways.
    lost_below: AtomicU64,
    /// While true, new connections are accepted but nothing is forwarded for them.
    holding: watch::Sender<bool>,
    /// Bumped by `cut`: every flow open at that moment is closed.
    cuts: watch::Sender<u64>,
    /// Flows numbered below this get a byte no RESP reply starts with before the next
    /// bytes the server sends them (once each).
    garbled_below: AtomicU64,
    /// Flows whose own port towards the server is listed: what the client sends on them
    /// is held, unread past one buffer, until they are no longer listed.
    stalled: watch::Sender<Vec<u16>>,
}

/// A fault-injecting TCP proxy on a loopback port; stops with the runtime.
pub struct FaultProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Starts passing every connection to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            target,
            accepted: AtomicU64::new(0),
            lost_below: AtomicU64::new(0),
            holding: watch::channel(false).0,
            cuts: watch::channel(0).0,
            garbled_below: AtomicU64::new(0),
            stalled: watch::channel(Vec::new()).0,
        });
        let sh = shared.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let flow = sh.accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(carry(sh.clone(), flow, client));
            }
        });
        Self { addr, shared }
    }

    /// `redis://` URL of the proxy.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Every flow open now is lost for good: bytes are dropped both ways, no FIN, no RST.
    /// New connections are not affected.
    pub fn lose_flows(&self) {
        let n = self.shared.accepted.load(Ordering::SeqCst);
        self.shared.lost_below.store(n, Ordering::SeqCst);
    }

    /// New connections are accepted (TCP up) but nothing is forwarded until `pass`.
    pub fn hold_new(&self) {
        self.shared.holding.send_replace(true);
    }

    /// New and held connections pass again (lost flows stay lost).
    pub fn pass(&self) {
        self.shared.holding.send_replace(false);
    }

    /// The next bytes the server sends on every flow open now are preceded by a line no
    /// reply starts with (`?`): the client can no longer read that flow's replies in step.
    /// New connections are not affected.
    pub fn garble_replies(&self) {
        let n = self.shared.accepted.load(Ordering::SeqCst);
        self.shared.garbled_below.store(n, Ordering::SeqCst);
    }

    /// What the client sends on the flows whose port towards the server (the `addr` that
    /// Redis's `CLIENT LIST` shows) is in `ports` is held still until [`Self::unstall`]:
    /// the server neither gets it nor hears anything of it.
    pub fn stall(&self, ports: &[u16]) {
        self.shared.stalled.send_replace(ports.to_vec());
    }

    /// The stalled flows carry what they held, and go on.
    pub fn unstall(&self) {
        self.shared.stalled.send_replace(Vec::new());
    }

    /// Closes every open connection (an idle cut by a proxy or load balancer).
    pub fn cut(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }
}

async fn carry(sh: Arc<Shared>, flow: u64, client: TcpStream) {
    let mut cuts = sh.cuts.subscribe();
    cuts.mark_unchanged();
    let mut holding = sh.holding.subscribe();
    tokio::select! {
        _ = holding.wait_for(|h| !*h) => {}
        _ = cuts.changed() => return,
    }
    let Ok(server) = TcpStream::connect(sh.target).await else {
        return;
    };
    let port = server.local_addr().map_or(0, |a| a.port());
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = pump(sh.clone(), (flow, port), false, cr, sw, cuts.clone());
    let down = pump(sh, (flow, port), true, sr, cw, cuts);
    tokio::join!(up, down);
}

async fn pump(
    sh: Arc<Shared>,
    (flow, port): (u64, u16),
    from_server: bool,
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut cuts: watch::Receiver<u64>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut garbled = false;
    loop {
        tokio::select! {
            read = from.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if flow < sh.lost_below.load(Ordering::SeqCst) {
                    continue;
                }
                if from_server && !garbled && flow < sh.garbled_below.load(Ordering::SeqCst) {
                    garbled = true;
                    if to.write_all(b"?garbled\r\n").await.is_err() {
                        break;
                    }
                }
                if !from_server {
                    let mut stalled = sh.stalled.subscribe();
                    let _ = stalled.wait_for(|p| !p.contains(&port)).await;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            _ = cuts.changed() => break,
        }
    }
    let _ = to.shutdown().await;
}
