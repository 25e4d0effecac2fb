//! `served` against an in-memory client: the framing hyper's server would write.

use super::*;
use http::{StatusCode, Version};
use std::collections::VecDeque;

/// What `served` writes for `response`, how the connection goes on, and whether it failed.
async fn write(response: Response<Body>, to_head: bool) -> (String, Result<Ending, String>) {
    let (mut ours, mut theirs) = tokio::io::duplex(64 * 1024);
    let mut inbox = Inbox::default();
    let ended = served(&mut ours, &mut inbox, response, (false, to_head))
        .await
        .map_err(|e| e.to_string());
    drop(ours);
    let mut out = Vec::new();
    theirs.read_to_end(&mut out).await.unwrap();
    (String::from_utf8(out).unwrap(), ended)
}

/// A body of chunks whose size is not known ahead.
struct Chunks(VecDeque<&'static str>);

impl HttpBody for Chunks {
    type Data = Bytes;
    type Error = crate::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, crate::BoxError>>> {
        let chunk = self.0.pop_front();
        Poll::Ready(chunk.map(|c| Ok(hyper::body::Frame::data(Bytes::from_static(c.as_bytes())))))
    }
}

fn streamed(chunks: &[&'static str]) -> Body {
    Chunks(chunks.iter().copied().collect()).boxed()
}

fn response(status: u16, fields: &[(&'static str, &'static str)], body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    for (n, v) in fields {
        r.headers_mut()
            .append(*n, http::HeaderValue::from_static(v));
    }
    r
}

/// The head without its `date`.
fn undated(wire: &str) -> String {
    wire.lines()
        .filter(|l| !l.starts_with("date: "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn a_known_size_is_a_length_and_an_unknown_one_is_chunked() {
    let (wire, ended) = write(response(201, &[("x-a", "1")], crate::full("hello")), false).await;
    assert_eq!(
        undated(&wire),
        "HTTP/1.1 201 Created\nx-a: 1\ncontent-length: 5\n\nhello"
    );
    assert_eq!(ended, Ok(Ending::KeepAlive));
    let (wire, ended) = write(response(200, &[], streamed(&["ab", "c"])), false).await;
    assert_eq!(
        undated(&wire),
        "HTTP/1.1 200 OK\ntransfer-encoding: chunked\n\n2\nab\n1\nc\n0\n"
    );
    assert_eq!(ended, Ok(Ending::KeepAlive));
}

#[tokio::test]
async fn a_declared_length_frames_a_stream_and_cuts_what_runs_past_it() {
    let fields = [("content-length", "3")];
    let (wire, ended) = write(response(200, &fields, streamed(&["ab", "cdef"])), false).await;
    assert_eq!(undated(&wire), "HTTP/1.1 200 OK\ncontent-length: 3\n\nabc");
    assert_eq!(ended, Ok(Ending::KeepAlive));
    // Short of it: the answer breaks off, and the connection cannot go on.
    let fields = [("content-length", "9")];
    let (wire, ended) = write(response(200, &fields, streamed(&["ab"])), false).await;
    assert!(wire.ends_with("\r\n\r\nab"), "{wire:?}");
    assert!(ended.is_err(), "{ended:?}");
}

#[tokio::test]
async fn bodiless_statuses_and_head_answers_send_no_body() {
    let (wire, _) = write(
        response(204, &[("content-length", "0")], crate::full("")),
        false,
    )
    .await;
    assert_eq!(undated(&wire), "HTTP/1.1 204 No Content\n");
    // HEAD: the length of the body it would have, none for an empty one with none declared.
    let (wire, _) = write(response(200, &[], crate::full("four")), true).await;
    assert_eq!(undated(&wire), "HTTP/1.1 200 OK\ncontent-length: 4\n");
    let (wire, _) = write(response(200, &[], crate::full("")), true).await;
    assert_eq!(undated(&wire), "HTTP/1.1 200 OK\n");
    let (wire, _) = write(
        response(200, &[("content-length", "7")], crate::full("")),
        true,
    )
    .await;
    assert_eq!(undated(&wire), "HTTP/1.1 200 OK\ncontent-length: 7\n");
}

#[tokio::test]
async fn an_http_1_0_answer_without_a_length_ends_with_the_connection() {
    let mut r = response(200, &[], streamed(&["old"]));
    *r.version_mut() = Version::HTTP_10;
    let (wire, ended) = write(r, false).await;
    assert_eq!(undated(&wire), "HTTP/1.0 200 OK\nconnection: close\n\nold");
    assert_eq!(ended, Ok(Ending::Close));
}

#[tokio::test]
async fn connection_close_in_the_response_is_written_once_and_ends_the_connection() {
    let r = response(400, &[("connection", "close")], crate::full("no"));
    let (wire, ended) = write(r, false).await;
    assert_eq!(
        undated(&wire),
        "HTTP/1.1 400 Bad Request\ncontent-length: 2\nconnection: close\n\nno"
    );
    assert_eq!(ended, Ok(Ending::Close));
}

#[tokio::test]
async fn a_client_that_half_closes_after_pipelining_is_still_answered() {
    let (mut ours, mut theirs) = tokio::io::duplex(1024);
    theirs
        .write_all(b"GET /next HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    theirs.shutdown().await.unwrap();
    let mut inbox = Inbox::default();
    let work = async {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        7
    };
    assert_eq!(watching(&mut ours, &mut inbox, work).await.unwrap(), 7);
    assert!(inbox.closed && inbox.bytes.starts_with(b"GET /next"));
    // With nothing pipelined, or only a stray line end or half a head, the client's end is
    // its departure.
    for sent in [&b""[..], b"\r\n", b"GET /next HTTP/1.1\r\nHost: a\r\n"] {
        let (mut ours, mut theirs) = tokio::io::duplex(1024);
        theirs.write_all(sent).await.unwrap();
        theirs.shutdown().await.unwrap();
        let mut inbox = Inbox::default();
        let gone = watching(&mut ours, &mut inbox, std::future::pending::<()>()).await;
        assert!(matches!(gone, Err(AnswerError::ClientGone)), "{sent:?}");
        assert!(!inbox.closed);
    }
}
