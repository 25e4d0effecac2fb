//! A deduped request's body, read within its bounds, and the bodies of requests refused
//! before they were read: drained (bounded) so the client's next request on a keep-alive
//! connection is read as one, or the connection is closed cleanly after the answer.

use std::time::Duration;

use bytes::{Buf, Bytes};
use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Incoming};
use tracing::warn;

use super::capture::Gathered;
use crate::config::Config;
use crate::edge::problem::GatewayError;
use crate::{Body, BoxError};

/// How much of a refused request body is read and thrown away before the refusal is sent.
/// Closing a connection with unread bytes in its receive buffer makes the kernel send a
/// reset, and the client may lose the answer it was about to read (nginx's "lingering
/// close" solves the same problem); a body left unread also leaves the connection
/// unusable for the client's next request. Larger bodies are cut off, and the answer says
/// `Connection: close`.
const DRAIN_LIMIT: u64 = 1024 * 1024;
/// The longest a refused body is drained.
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// A request the gateway answers itself before it has read (all of) the body.
pub(super) struct Refusal {
    /// The answer.
    pub error: GatewayError,
    /// The body was not read to its end: the answer says `Connection: close`.
    pub close: bool,
}

impl Refusal {
    /// A refusal of a request whose body was read whole.
    pub fn read(error: GatewayError) -> Self {
        Self {
            error,
            close: false,
        }
    }

    /// `error`, once `body` is drained within the bounds; the connection stays usable
    /// when all of it was read. Ambiguous framing is never drained: where its body ends
    /// is the very question, so the connection closes.
    pub async fn drained<B>(error: GatewayError, body: B) -> Self
    where
        B: HttpBody + Unpin,
    {
        let close = match error {
            GatewayError::AmbiguousFraming => true,
            _ => !drain(body, tokio::time::Instant::now() + DRAIN_TIME).await,
        };
        Self { error, close }
    }
}

/// A client request's body as the upstream call streams it.
pub(super) fn streamed(body: Incoming) -> Body {
    body.map_err(BoxError::from).boxed()
}

/// Buffers a deduped request's body within `server.max_body` and `server.body_read_timeout`.
/// A body that arrives in one frame (the common case) is kept without a copy.
pub(super) async fn read_body(
    mut body: Incoming,
    parts: &Parts,
    config: &Config,
) -> Result<Bytes, Refusal> {
    let limit = config.server.max_body;
    let deadline = tokio::time::Instant::now() + config.server.body_read_timeout;
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = |whole: bool| Refusal {
        error: GatewayError::BodyTooLarge { limit },
        close: !whole,
    };
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large(drain(body, deadline).await));
    }
    let mut gathered = Gathered::default();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return Err(Refusal {
                    error: GatewayError::BodyTimeout,
                    close: true,
                })
            }
            Ok(None) => return Ok(gathered.into_bytes()),
            Ok(Some(Err(e))) => {
                warn!(error = %e, "request body could not be read");
                return Err(Refusal {
                    error: GatewayError::BodyUnreadable,
                    close: true,
                });
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if gathered.push(data) as u64 > limit {
            return Err(too_large(drain(body, deadline).await));
        }
    }
}

/// Reads and discards what is left of a refused body, up to [`DRAIN_LIMIT`] bytes and
/// [`DRAIN_TIME`] (or `deadline`, if sooner). True when the body was read to its end.
async fn drain<B>(mut body: B, deadline: tokio::time::Instant) -> bool
where
    B: HttpBody + Unpin,
{
    let until = deadline.min(tokio::time::Instant::now() + DRAIN_TIME);
    let mut read = 0u64;
    while read <= DRAIN_LIMIT {
        if body.is_end_stream() {
            return true;
        }
        match tokio::time::timeout_at(until, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                read += frame.data_ref().map_or(0, |d| d.remaining() as u64);
            }
            Ok(None) => return true,
            _ => return false,
        }
    }
    false
}
