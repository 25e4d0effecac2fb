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

use crate::protocol::headers::REPLAYED;
use crate::store::{RequestHash, StoreKey};
use crate::Body;

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
            closed: false,
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

/// A winner's offer: fed as its body arrives, closed when its record is stored. Dropped
/// unclosed (its task ended or was dropped mid-body), it closes as broken off: its
/// joiners end in an error and later duplicates go to the claim, never to a dead stream.
pub(super) struct Opened {
    streams: Arc<Streams>,
    key: StoreKey,
    broadcast: Arc<Broadcast>,
    closed: bool,
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
    pub(super) fn close(mut self, whole: bool) {
        self.end(whole);
    }

    fn end(&mut self, whole: bool) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        {
            let mut streams = self.streams.lock();
            // Only this offer's entry: a later stream for the key is not this one's to end.
            if streams
                .get(&self.key)
                .is_some_and(|b| Arc::ptr_eq(b, &self.broadcast))
            {
                streams.remove(&self.key);
            }
        }
        self.broadcast.lock().ended = Some(whole);
        self.broadcast.bump();
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        self.end(false);
    }
}

/// Feeds a joiner's body: the chunks so far, then each as it comes, until the end.
async fn follow(
    broadcast: Arc<Broadcast>,
    mut version: watch::Receiver<u64>,
    tx: super::stream::Frames,
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
            Some(true) => return tx.end(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::time::Duration;

    fn offered(streams: &Arc<Streams>, key: &StoreKey, hash: RequestHash) -> Opened {
        let opened = streams.open(key, hash, StatusCode::OK, HeaderMap::new(), 1 << 20);
        opened.push(&Bytes::from_static(b"part"));
        opened
    }

    /// A winner's task dropped mid-body (a panic, a task cut off): its offer is no longer
    /// joinable, so a duplicate goes to the claim instead of a dead stream.
    #[tokio::test]
    async fn an_offer_dropped_unclosed_is_not_offered_again() {
        let streams = Arc::new(Streams::default());
        let (key, hash) = (StoreKey::from_raw("k"), RequestHash::new([7; 32]));
        drop(offered(&streams, &key, hash));
        assert!(streams.join(&key, &hash).is_none());
    }

    /// A joiner of an offer dropped unclosed gets the bytes so far, then an error.
    #[tokio::test]
    async fn the_joiner_of_a_dropped_offer_ends_in_an_error() {
        let streams = Arc::new(Streams::default());
        let (key, hash) = (StoreKey::from_raw("k"), RequestHash::new([7; 32]));
        let opened = offered(&streams, &key, hash);
        let mut body = streams.join(&key, &hash).unwrap().into_body();
        drop(opened);
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "part");
        let next = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("the joiner's body ends");
        assert!(matches!(next, Some(Err(_))), "broken off, not whole");
    }

    /// A closed offer ends only its own entry: a newer offer for the key stays joinable.
    #[tokio::test]
    async fn closing_an_old_offer_leaves_a_newer_one_for_the_key() {
        let streams = Arc::new(Streams::default());
        let (key, hash) = (StoreKey::from_raw("k"), RequestHash::new([7; 32]));
        let old = offered(&streams, &key, hash);
        let new = offered(&streams, &key, hash);
        old.close(true);
        assert!(streams.join(&key, &hash).is_some());
        new.close(true);
        assert!(streams.join(&key, &hash).is_none());
    }
}
