//! Resource limits against real sockets: clients that stop reading, silent admin
//! connections, a byte-bounded embedded store, exact JSON numbers in fingerprints.

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw client with a tiny receive buffer that sends `request` and reads only the
/// first bytes of the answer, then never reads again.
async fn stalled_reader(addr: std::net::SocketAddr, request: &str) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(2048).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 201", "the response must have started");
    s
}

/// Reads what is left until the gateway's close (EOF or reset); returns the byte count.
async fn drain(mut s: TcpStream) -> usize {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0;
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        total += n;
    }
    total
}

const BIG: usize = 8 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stop_reading_a_passthrough_are_cut_after_write_timeout() {
    let upstream = Upstream::start().await;
    let gw = TestGateway::start(
        &upstream,
        "max_connections = 10\nwrite_timeout = \"3s\"",
        "",
    )
    .await;
    let mut stalled = Vec::new();
    for i in 0..10 {
        let req = format!("GET /big/{i} HTTP/1.1\r\nHost: x\r\nX-Test-Body-Bytes: {BIG}\r\n\r\n");
        stalled.push(stalled_reader(gw.addr, &req).await);
    }
    upstream.wait_for_effects(10).await;

    // Every slot is held by a client that does not read: nobody else is served yet.
    let http = Http::new();
    let early =
        tokio::time::timeout(Duration::from_millis(500), http.get(&gw.url("/small"), &[])).await;
    assert!(
        early.is_err(),
        "the ten stalled clients should hold every slot"
    );

    // After write_timeout the stalled clients are cut and a new client is served.
    let later = tokio::time::timeout(Duration::from_secs(20), http.get(&gw.url("/small"), &[]))
        .await
        .expect("a new client was never served: stalled readers keep their slots");
    assert_eq!(later.status, 201);
    for s in stalled {
        let got = drain(s).await;
        assert!(
            got < BIG,
            "a stalled client received the whole body ({got} bytes)"
        );
    }
}
