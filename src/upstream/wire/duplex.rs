//! An answer that came before its request was all sent: the rest of the upload and the
//! reading of the answer go on in a task of their own, so that neither waits for the
//! other.
//!
//! A body is read when its reader asks (hyper's server asks only while it can write to
//! the client); an upload driven only from there would stop whenever the client stops
//! reading, and a client that sends its whole request before it reads the answer (many
//! do) would wait on the gateway, which waits on it. The task keeps sending while the
//! answer waits in a small channel for its reader.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame};
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

use super::body::WireBody;
use super::WireError;

/// How many frames of the answer wait for their reader.
const WAITING: usize = 4;

/// The answer's frames, as the task reads them.
pub(super) struct Frames {
    rx: mpsc::Receiver<Result<Frame<Bytes>, WireError>>,
    /// Set by the task when the body ended as its framing says.
    whole: Arc<AtomicBool>,
    /// An error was given: nothing more to say.
    over: bool,
}

impl Frames {
    /// The next frame; the channel closing before the task saw the body's end (the task
    /// panicked or was dropped) is a truncated body, never a clean end.
    pub(super) fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, WireError>>> {
        if self.over {
            return Poll::Ready(None);
        }
        match std::task::ready!(self.rx.poll_recv(cx)) {
            Some(Err(e)) => {
                self.over = true;
                Poll::Ready(Some(Err(e)))
            }
            None if !self.whole.load(Ordering::Acquire) => {
                self.over = true;
                Poll::Ready(Some(Err(WireError::Truncated)))
            }
            next => Poll::Ready(next),
        }
    }
}

/// Starts the task that sends the rest of `body`'s upload and reads its frames. It ends
/// with the body (the upload, if any is left, then goes on as
/// [`WireBody`]'s end sends it) or when the reader is gone (the connection is then
/// closed, as when a body is dropped).
pub(super) fn spawn(body: WireBody) -> Frames {
    let (tx, rx) = mpsc::channel(WAITING);
    let whole = Arc::new(AtomicBool::new(false));
    tokio::spawn(relay(body, tx, whole.clone()));
    Frames {
        rx,
        whole,
        over: false,
    }
}

async fn relay(
    mut body: WireBody,
    tx: mpsc::Sender<Result<Frame<Bytes>, WireError>>,
    whole: Arc<AtomicBool>,
) {
    let gone = tx.clone();
    let mut tx = PollSender::new(tx);
    let relayed = poll_fn(|cx| loop {
        body.poll_upload(cx);
        match tx.poll_reserve(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(_)) => return Poll::Ready(()),
            Poll::Pending => return Poll::Pending,
        }
        match Pin::new(&mut body).poll_frame(cx) {
            Poll::Ready(Some(frame)) => {
                let failed = frame.is_err();
                if tx.send_item(frame).is_err() || failed {
                    return Poll::Ready(());
                }
            }
            Poll::Ready(None) => {
                whole.store(true, Ordering::Release);
                return Poll::Ready(());
            }
            Poll::Pending => return Poll::Pending,
        }
    });
    // A reader gone while the task waits on the upstream ends it too.
    tokio::select! {
        () = relayed => {}
        () = gone.closed() => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::Request;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::super::Conn;
    use super::*;
    use crate::BoxError;

    /// A request body that gives one frame and then never ends.
    struct Endless(bool);

    impl HttpBody for Endless {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            if self.0 {
                return Poll::Pending;
            }
            self.0 = true;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"part")))))
        }
    }

    /// An upstream that answers half a body as soon as it has the head, then reads until
    /// the connection closes; ends then.
    async fn answering_early() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let upstream = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 65536];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0);
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nearly")
                .await
                .unwrap();
            while s.read(&mut buf).await.unwrap_or(0) > 0 {}
        });
        (addr, upstream)
    }

    #[tokio::test]
    async fn a_relay_that_ends_before_the_body_does_gives_an_error_not_an_end() {
        let (tx, rx) = mpsc::channel(WAITING);
        let mut frames = Frames {
            rx,
            whole: Arc::new(AtomicBool::new(false)),
            over: false,
        };
        tx.send(Ok(Frame::data(Bytes::from_static(b"half"))))
            .await
            .unwrap();
        // The task gone (a panic, a runtime shutting down) without seeing the body's end.
        drop(tx);
        let first = poll_fn(|cx| frames.poll_recv(cx)).await;
        assert!(first.unwrap().is_ok());
        let second = poll_fn(|cx| frames.poll_recv(cx)).await;
        assert!(matches!(second, Some(Err(WireError::Truncated))));
        assert!(poll_fn(|cx| frames.poll_recv(cx)).await.is_none());
    }

    #[tokio::test]
    async fn an_answer_dropped_while_its_upload_waits_closes_the_connection() {
        let (addr, upstream) = answering_early().await;
        let conn = Conn::new(TcpStream::connect(addr).await.unwrap());
        let req = Request::post("/up")
            .header("host", "up")
            .body(Endless(false).boxed())
            .unwrap();
        let Ok(resp) = conn.exchange(req).await else {
            panic!("no answer");
        };
        let mut body = resp.into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "early");
        // Neither the upload nor the answer can go on; the reader leaves.
        drop(body);
        tokio::time::timeout(Duration::from_secs(5), upstream)
            .await
            .expect("the connection outlived its answer's reader")
            .unwrap();
    }

    /// An upstream that reads a request's head, waits for the upload to fill the
    /// sockets, then answers 413 and closes with an RST (the rest of the upload unread).
    async fn refusing() -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        let n = s.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        got.extend_from_slice(&buf[..n]);
                    }
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    s.write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .await
                        .unwrap();
                    s.set_zero_linger().unwrap();
                    drop(s);
                });
            }
        });
        addr
    }

    /// One exchange of a 16 MiB upload the upstream refuses early; `spend`: all but one
    /// unit of tokio's cooperative budget spent before each poll (as the client's socket
    /// work does in the same task).
    async fn refused_upload(addr: std::net::SocketAddr, spend: bool) -> Result<u16, String> {
        use std::future::Future;
        let conn = Conn::new(TcpStream::connect(addr).await.unwrap());
        let body = crate::full(Bytes::from(vec![b'x'; 16 << 20]));
        let req = Request::post("/up")
            .header("host", "up")
            .body(body)
            .unwrap();
        let mut fut = Box::pin(conn.exchange(req));
        let (tx, mut rx) = mpsc::unbounded_channel::<u8>();
        let out = poll_fn(|cx| {
            if spend {
                for _ in 0..127 {
                    tx.send(0).unwrap();
                }
                for _ in 0..127 {
                    assert!(rx.poll_recv(cx).is_ready());
                }
            }
            fut.as_mut().poll(cx)
        })
        .await;
        match out {
            Ok(resp) => Ok(resp.status().as_u16()),
            Err(super::super::Failed::Broken(e)) => Err(format!("broken: {e:?}")),
            Err(super::super::Failed::Unsent(_, e)) => Err(format!("unsent: {e:?}")),
        }
    }

    #[tokio::test]
    async fn an_early_answer_survives_a_failed_write_that_spent_the_budget() {
        let addr = refusing().await;
        let mut plain = Vec::new();
        let mut spent = Vec::new();
        for _ in 0..8 {
            plain.push(refused_upload(addr, false).await);
            spent.push(refused_upload(addr, true).await);
        }
        assert!(plain.iter().all(|r| *r == Ok(413)), "control: {plain:?}");
        assert!(
            spent.iter().all(|r| *r == Ok(413)),
            "budget spent: {spent:?}"
        );
    }
}
