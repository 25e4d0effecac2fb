//! `on_conflict = "join"`: a duplicate that meets the first request's answer streaming on
//! this gateway receives the bytes so far, then the rest as they arrive, from the one
//! upstream call, marked as a replay. Where there is no such stream (another gateway has
//! it, or its head has not arrived), the duplicate waits as with `wait`.
//!
//! Bounded: a stream keeps at most `max_cached_body` bytes for joiners (the copy the record
//! is made of), and at most [`MAX_JOINERS`] join one stream. A stream past its bytes can
//! no longer be joined, and joiners that have not caught up end with an error.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use hyper::body::Frame;
use tokio::sync::watch;

use crate::headers::REPLAYED;
use crate::store::{RequestHash, StoreKey};
use crate::{Body, BoxError};

/// The most duplicates that join one stream.
pub(super) const MAX_JOINERS: usize = 64;

/// The answers streaming on this gateway that duplicates may join, by store key.
#[derive(Default)]
pub(super) struct Streams(Mutex<HashMap<StoreKey, Arc<Broadcast>>>);

impl Streams {
    /// Offers a winner's streaming answer to duplicates until it ends.
    pub(super) fn open(
        self: &Arc<Self>,
        key: &StoreKey,
        request_hash: RequestHash,
        status: StatusCode,
        headers: HeaderMap,
        limit: u64,
    ) -> Opened {
        let (version, _) = watch::channel(0);
        let broadcast = Arc::new(Broadcast {
            request_hash,
            status,
            headers,
            limit,
            state: Mutex::new(State::default()),
            version,
        });
        self.lock().insert(key.clone(), broadcast.clone());
        Opened {
            streams: self.clone(),
            key: key.clone(),
            broadcast,
        }
    }

    /// Joins the answer streaming for `key`, if there is one for the same request with
    /// room for another joiner: its head, as a replay, and a body that follows it.
    pub(super) fn join(
        &self,
        key: &StoreKey,
        request_hash: &RequestHash,
    ) -> Option<Response<Body>> {
        let broadcast = self.lock().get(key)?.clone();
        if broadcast.request_hash != *request_hash {
            return None;
        }
        {
            let mut state = broadcast.lock();
            if state.overflowed || state.joiners >= MAX_JOINERS {
                return None;
            }
            state.joiners += 1;
        }
        let mut headers = broadcast.headers.clone();
        headers.insert(REPLAYED.clone(), HeaderValue::from_static("true"));
        let (tx, body) = super::stream::channel();
        tokio::spawn(follow(broadcast.clone(), broadcast.version.subscribe(), tx));
        let mut response = Response::new(http_body_util::BodyExt::boxed(body));
        *response.status_mut() = broadcast.status;
        *response.headers_mut() = headers;
        Some(response)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<StoreKey, Arc<Broadcast>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One winner's streaming answer, as joiners see it.
pub(super) struct Broadcast {
    request_hash: RequestHash,
    status: StatusCode,
    headers: HeaderMap,
    limit: u64,
    state: Mutex<State>,
    /// Bumped on every chunk and at the end: joiners wake on it.
    version: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    chunks: Vec<Bytes>,
    held: u64,
    overflowed: bool,
    /// `Some(true)` once whole, `Some(false)` once broken off.
    ended: Option<bool>,
    joiners: usize,
}

impl Broadcast {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }
}

/// A winner's offer: fed as its body arrives, closed when its record is stored.
pub(super) struct Opened {
    streams: Arc<Streams>,
    key: StoreKey,
    broadcast: Arc<Broadcast>,
}

impl Opened {
    /// A chunk of the body, for joiners; past the limit the stream stops being joinable.
    pub(super) fn push(&self, data: &Bytes) {
        let b = &self.broadcast;
        {
            let mut state = b.lock();
            if state.overflowed {
                return;
            }
            state.held += data.len() as u64;
            if state.held > b.limit {
                state.overflowed = true;
                state.chunks.clear();
            } else {
                state.chunks.push(data.clone());
            }
        }
        b.bump();
    }

    /// The end of the body (`whole`, or broken off): joiners finish, no new one joins.
    pub(super) fn close(self, whole: bool) {
        self.streams.lock().remove(&self.key);
        self.broadcast.lock().ended = Some(whole);
        self.broadcast.bump();
    }
}

/// Feeds a joiner's body: the chunks so far, then each as it comes, until the end.
async fn follow(
    broadcast: Arc<Broadcast>,
    mut version: watch::Receiver<u64>,
    tx: tokio::sync::mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
) {
    let _joined = Joiner(broadcast.clone());
    let mut next = 0;
    loop {
        // Marked seen before looking, so a chunk pushed meanwhile wakes the wait below.
        version.borrow_and_update();
        let (chunks, ended, overflowed) = {
            let state = broadcast.lock();
            let chunks = state.chunks.get(next..).unwrap_or_default().to_vec();
            (chunks, state.ended, state.overflowed)
        };
        if overflowed {
            let _ = tx
                .send(Err(
                    "the answer outgrew what a joined stream may hold".into()
                ))
                .await;
            return;
        }
        for chunk in chunks {
            next += 1;
            if tx.send(Ok(Frame::data(chunk))).await.is_err() {
                return;
            }
        }
        match ended {
            Some(true) => return,
            Some(false) => {
                let _ = tx
                    .send(Err("the first request's answer broke off".into()))
                    .await;
                return;
            }
            None => {}
        }
        if version.changed().await.is_err() {
            return;
        }
    }
}

/// Counts a joiner for as long as it follows.
struct Joiner(Arc<Broadcast>);

impl Drop for Joiner {
    fn drop(&mut self) {
        self.0.lock().joiners -= 1;
    }
}
