//! Resource limits against real sockets: clients that stop reading, silent admin
//! connections, a byte-bounded embedded store, exact JSON numbers in fingerprints.

use std::time::Duration;

use dedupe_test_support::{
    eventually, GatewayConfig, GatewayProcess, Http, RouteCfg, StoreCfg, TestGateway, Upstream,
};
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
        &GatewayConfig::new(upstream.url())
            .max_connections(10)
            .write_timeout("3s"),
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
    // The ten were stalled at slightly different times; let every deadline pass before
    // reading, since reading would restart a deadline that has not fired yet.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for s in stalled {
        let got = drain(s).await;
        assert!(
            got < BIG,
            "a stalled client received the whole body ({got} bytes)"
        );
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Opens `n` connections that never send a byte.
async fn silent(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(TcpStream::connect(addr).await.unwrap());
    }
    v
}

/// Whether every connection is closed by the gateway within `within`.
async fn all_closed(conns: Vec<TcpStream>, within: Duration) -> usize {
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let mut b = [0u8; 16];
                matches!(
                    tokio::time::timeout(within, s.read(&mut b)).await,
                    Ok(Ok(0) | Err(_))
                )
            })
        })
        .collect();
    let mut open = 0;
    for t in tasks {
        if !t.await.unwrap() {
            open += 1;
        }
    }
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_admin_connections_are_capped_and_cut_after_header_read_timeout() {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(
        &GatewayConfig::new(upstream.url())
            .header_read_timeout("1s")
            .admin_max_connections(16),
    );
    let pid = gw.child.id();
    let http = Http::new();
    assert_eq!(http.get(&gw.admin_url("/healthz"), &[]).await.status, 200);
    let base = open_fds(pid);

    let conns = silent(gw.admin.unwrap(), 200).await;
    // The public port keeps serving while the admin port is flooded.
    let r = tokio::time::timeout(Duration::from_secs(10), http.get(&gw.url("/x"), &[]))
        .await
        .expect("the public port stopped serving during an admin flood");
    assert_eq!(r.status, 201);
    // The gateway holds at most admin.max_connections of them at a time.
    let mut most = 0;
    for _ in 0..20 {
        most = most.max(open_fds(pid));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        most <= base + 16 + 4,
        "the admin flood took {most} descriptors (baseline {base}, cap 16)"
    );
    // Each silent connection is cut after header_read_timeout (in rounds of 16).
    let open = all_closed(conns, Duration::from_secs(30)).await;
    assert_eq!(open, 0, "{open} silent admin connections were never closed");
    assert_eq!(http.get(&gw.admin_url("/healthz"), &[]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_accepts_back_off_and_recover() {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(&GatewayConfig::new(upstream.url()).header_read_timeout("1s"));
    let pid = gw.child.id().to_string();
    let limit = open_fds(gw.child.id()) + 24;
    let ok = std::process::Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={limit}:{limit}")])
        .status()
        .unwrap()
        .success();
    assert!(ok, "prlimit failed");

    // More silent connections than the process has descriptors: accepts fail (EMFILE).
    let conns = silent(gw.addr, 200).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let failures = gw
        .logs
        .lock()
        .unwrap()
        .iter()
        .filter(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("accept failed"))
        })
        .count();
    assert!(
        (1..=5).contains(&failures),
        "expected one warning per run of failed accepts, got {failures}"
    );
    // Silent connections are cut, descriptors come back, and the port serves again.
    let http = Http::new();
    let served = eventually(Duration::from_secs(40), || {
        let http = http.clone();
        let url = gw.url("/x");
        async move { matches!(http.send("GET", &url, &[], "").await, Ok(r) if r.status == 201) }
    })
    .await;
    assert!(
        served,
        "the public port never recovered after running out of descriptors"
    );
    drop(conns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_store_refuses_new_keys_past_max_bytes_and_keeps_what_it_holds() {
    let upstream = Upstream::start().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(upstream.url())
            .store(StoreCfg::memory().max_bytes("64KiB"))
            .route(RouteCfg::header("orders", "/orders")),
    )
    .await;
    let http = Http::new();
    let body_bytes = "20000";
    let mut stored = Vec::new();
    let refused = loop {
        let key = format!("order-{}", stored.len());
        let r = http
            .post(
                &gw.url("/orders"),
                &[("Idempotency-Key", &key), ("X-Test-Body-Bytes", body_bytes)],
                "{}",
            )
            .await;
        if r.status != 201 {
            break r;
        }
        stored.push(key);
        assert!(
            stored.len() < 10,
            "64KiB of 20000-byte responses never filled"
        );
    };
    assert_eq!(refused.status, 503);
    assert_eq!(
        refused.problem_type(),
        "urn:dedupe-gateway:problem:store-unavailable"
    );
    assert!((3..=4).contains(&stored.len()), "{} stored", stored.len());
    let executed = upstream.effects();
    assert_eq!(
        executed,
        stored.len() as u64,
        "the refused claim reached the upstream"
    );
    // Nothing held was evicted to make room: every stored key still replays.
    for key in &stored {
        let r = http
            .post(
                &gw.url("/orders"),
                &[("Idempotency-Key", key), ("X-Test-Body-Bytes", body_bytes)],
                "{}",
            )
            .await;
        assert!(r.replayed(), "{key} was not replayed: {}", r.status);
        assert_eq!(r.body.len(), 20000);
    }
    assert_eq!(upstream.effects(), executed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprints_tell_big_integers_apart_and_refuse_duplicate_keys() {
    let upstream = Upstream::start().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(upstream.url()).route(RouteCfg::fingerprint(
            "hooks",
            "/hooks",
            &["json:/order_id"],
        )),
    )
    .await;
    let http = Http::new();
    let first = http
        .post(
            &gw.url("/hooks"),
            &[],
            r#"{"order_id":100000000000000000000001}"#,
        )
        .await;
    let second = http
        .post(
            &gw.url("/hooks"),
            &[],
            r#"{"order_id":100000000000000000000002}"#,
        )
        .await;
    assert_eq!(
        (first.status.as_u16(), second.status.as_u16()),
        (201, 201),
        "{}",
        second.text()
    );
    assert!(!second.replayed());
    assert_eq!(
        upstream.effects(),
        2,
        "two different events, two executions"
    );
    let again = http
        .post(
            &gw.url("/hooks"),
            &[],
            r#"{"order_id":100000000000000000000002}"#,
        )
        .await;
    assert!(again.replayed());

    let dup = http
        .post(&gw.url("/hooks"), &[], r#"{"order_id":1,"order_id":2}"#)
        .await;
    assert_eq!(dup.status, 400);
    assert_eq!(
        dup.problem_type(),
        "urn:dedupe-gateway:problem:ambiguous-json"
    );
    assert!(dup.text().contains("order_id"), "{}", dup.text());
    assert_eq!(
        upstream.effects(),
        2,
        "an ambiguous body must not be forwarded"
    );
}

/// Clients that hang up leave their requests running so every claim settles, but only up to
/// `max_connections` of them: past that, new claims are refused before claiming (503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_outliving_their_clients_are_bounded() {
    let upstream = Upstream::start().await;
    let gw = TestGateway::start(
        &GatewayConfig::new(upstream.url())
            .max_connections(4)
            .route(RouteCfg::header("orders", "/orders")),
    )
    .await;
    let mut gone = Vec::new();
    for i in 0..4 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        let req = format!(
            "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: left-{i}\r\n\
             X-Test-Delay-Ms: 2000\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        gone.push(s);
    }
    upstream.wait_for_effects(4).await;
    drop(gone);
    let http = Http::new();
    // The gateway learns that a client left when its connection closes: until then a new
    // request may still be served (and counted). Each try uses a fresh key.
    let served_before = std::sync::atomic::AtomicU64::new(0);
    let attempt = std::sync::atomic::AtomicU64::new(0);
    let refused = eventually(Duration::from_secs(1), || async {
        let n = attempt.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let r = http
            .post(
                &gw.url("/orders"),
                &[("Idempotency-Key", &format!("new-{n}"))],
                "{}",
            )
            .await;
        if r.status == 201 {
            served_before.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        r.status == 503 && r.problem_type() == "urn:dedupe-gateway:problem:overloaded"
    })
    .await;
    assert!(refused, "a fifth detached request was not refused");
    let before = served_before.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        upstream.effects(),
        4 + before,
        "a refused claim never reaches the upstream"
    );
    // Once the detached calls end, claims are made again; the detached ones were stored.
    let served = eventually(Duration::from_secs(10), || async {
        http.post(&gw.url("/orders"), &[("Idempotency-Key", "after")], "{}")
            .await
            .status
            == 201
    })
    .await;
    assert!(served, "new claims were not accepted again");
    // Each detached request settles its claim: once done, a retry replays it (409 while
    // it is still in flight).
    for i in 0..4 {
        let key = format!("left-{i}");
        let replayed = eventually(Duration::from_secs(10), || async {
            http.post(&gw.url("/orders"), &[("Idempotency-Key", &key)], "{}")
                .await
                .replayed()
        })
        .await;
        assert!(replayed, "the detached request {key} was not stored");
    }
    assert_eq!(upstream.effects(), 5 + before);
}
