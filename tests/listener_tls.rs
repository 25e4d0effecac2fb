//! TLS on the public listener (`[server.tls]`), checked with `curl --cacert` over HTTP/1.1
//! and HTTP/2 (ALPN), and a certificate replaced by SIGHUP.

use std::process::Command;

use dedupe_test_support::{GatewayConfig, GatewayProcess, RouteCfg, StoreCfg, TestCa, Upstream};

/// `curl` against the gateway by name (`localhost`, resolved to its loopback address),
/// trusting only `ca`. Returns (HTTP version, status, body) or curl's error.
fn curl(
    gw: &GatewayProcess,
    ca: &std::path::Path,
    version: &str,
    key: &str,
) -> Result<(String, u16, String), String> {
    let port = gw.addr.port();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", version, "--cacert"])
        .arg(ca)
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .args([
            "-X",
            "POST",
            "-H",
            &format!("Idempotency-Key: {key}"),
            "-d",
            "{}",
        ])
        .args(["-w", "\n%{http_version} %{http_code}"])
        .arg(format!("https://localhost:{port}/orders/{key}"))
        .output()
        .expect("curl not installed");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = text.rsplit_once('\n').unwrap();
    let (v, code) = tail.split_once(' ').unwrap();
    Ok((v.to_owned(), code.parse().unwrap(), body.to_owned()))
}

fn config(up: &Upstream, cert: &dedupe_test_support::CertFiles) -> GatewayConfig {
    GatewayConfig::new(up.url())
        .store(StoreCfg::memory())
        .listener_tls(cert)
        .route(RouteCfg::header("orders", "/orders/*"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_gets_the_gateway_over_tls_with_http1_and_http2() {
    let ca = TestCa::new("listener");
    let up = Upstream::start().await;
    let gw = GatewayProcess::start(&config(&up, &ca.issue("gateway")));
    let (v, status, first) = curl(&gw, &ca.ca_file, "--http1.1", "h1").unwrap();
    assert_eq!((v.as_str(), status), ("1.1", 201), "{first}");
    let (v, status, again) = curl(&gw, &ca.ca_file, "--http2", "h1").unwrap();
    assert_eq!((v.as_str(), status), ("2", 201), "ALPN h2: {again}");
    assert_eq!(
        again, first,
        "the HTTP/2 retry is the HTTP/1.1 winner's replay"
    );
    assert_eq!(up.effects(), 1);
    assert_eq!(up.seen()[0].headers["x-forwarded-proto"], "https");
    // Plain HTTP on the TLS port gets no answer.
    let plain = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg(format!("http://127.0.0.1:{}/orders/x", gw.addr.port()))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_serves_a_new_certificate() {
    let old_ca = TestCa::new("old");
    let new_ca = TestCa::new("new");
    let up = Upstream::start().await;
    let gw = GatewayProcess::start(&config(&up, &old_ca.issue("gateway")));
    assert_eq!(curl(&gw, &old_ca.ca_file, "--http2", "a").unwrap().1, 201);
    let e = curl(&gw, &new_ca.ca_file, "--http2", "a").unwrap_err();
    assert!(e.contains("certificate"), "{e}");

    std::fs::write(
        &gw.config_path,
        config(&up, &new_ca.issue("gateway")).to_toml(),
    )
    .unwrap();
    gw.signal("HUP");
    gw.wait_logged("SIGHUP: listener certificate reloaded")
        .await;
    let (_, status, _) = curl(&gw, &new_ca.ca_file, "--http2", "b").unwrap();
    assert_eq!(status, 201);
    let e = curl(&gw, &old_ca.ca_file, "--http1.1", "c").unwrap_err();
    assert!(
        e.contains("certificate"),
        "the old certificate is gone: {e}"
    );
}

/// Waits up to `within` for `child` to exit; true when it did.
fn exits_within(child: &mut std::process::Child, within: std::time::Duration) -> bool {
    let until = std::time::Instant::now() + within;
    while std::time::Instant::now() < until {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_that_send_nothing_after_the_handshake_give_their_slots_back() {
    use std::process::Stdio;
    let ca = TestCa::new("silent");
    let up = Upstream::start().await;
    let cfg = config(&up, &ca.issue("gateway"))
        .max_connections(2)
        .header_read_timeout("1s");
    let gw = GatewayProcess::start(&cfg);
    // As many clients as there are slots finish the handshake, then send nothing (their
    // standard input stays open and empty).
    let mut silent: Vec<_> = (0..2)
        .map(|_| {
            Command::new("openssl")
                .args(["s_client", "-quiet", "-connect"])
                .arg(gw.addr.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("openssl not installed")
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (_, status, _) = curl(&gw, &ca.ca_file, "--http1.1", "after-silence")
        .expect("silent TLS clients kept every connection slot");
    assert_eq!(status, 201);
    for c in &mut silent {
        assert!(
            exits_within(c, std::time::Duration::from_secs(10)),
            "the gateway never closed a silent TLS connection"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_route_claims_over_tls_tells_the_upstream_its_hop_was_https() {
    let ca = TestCa::new("listener");
    let up = Upstream::start().await;
    let gw = GatewayProcess::start(&config(&up, &ca.issue("gateway")));
    let port = gw.addr.port();
    // Two requests on one HTTP/1.1 connection, each claiming a plain hop.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--http1.1", "--cacert"])
        .arg(&ca.ca_file)
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .args(["-H", "X-Forwarded-Proto: http", "-d", "{}"])
        .args(["-w", "%{http_code}\n", "-o", "/dev/null"])
        .arg(format!("https://localhost:{port}/plain/1"))
        .args(["-H", "X-Forwarded-Proto: http", "-d", "{}"])
        .args(["-w", "%{http_code}\n", "-o", "/dev/null"])
        .arg(format!("https://localhost:{port}/plain/2"))
        .output()
        .expect("curl not installed");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "201\n201\n");
    let seen = up.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        let proto: Vec<_> = s.headers.get_all("x-forwarded-proto").iter().collect();
        assert_eq!(proto, ["https"], "{:?}", s.headers);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_over_tls_reaches_a_slow_reader_whole() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = TestCa::new("listener");
    let up = Upstream::start().await;
    let gw = GatewayProcess::start(&config(&up, &ca.issue("gateway")));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&ca.ca_file).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let client = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client));
    let tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    // A keep-alive request whose answer is larger than the sockets hold: the gateway's
    // last writes meet a full socket while the client is not reading yet.
    let size = 3_900_000;
    let request =
        format!("GET /plain/big HTTP/1.1\r\nHost: localhost\r\nX-Test-Body-Bytes: {size}\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let whole = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let n = tls.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the connection closed after {} bytes", got.len());
            got.extend_from_slice(&chunk[..n]);
            if let Some(head) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                if got.len() >= head + 4 + size {
                    return;
                }
            }
        }
    })
    .await;
    assert!(whole.is_ok(), "{} bytes of the answer arrived", got.len());
}
