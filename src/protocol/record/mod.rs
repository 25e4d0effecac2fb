//! The encoding of stored responses: what a replay needs (status, headers, body) plus the
//! key it was stored under, in a compact length-prefixed binary form. Pure; unit-tested here.
//!
//! Layout (all integers big-endian):
//! `"DGR3"` | key: u16 len + bytes | expires: u64 Unix seconds (0: not known) |
//! status: u16 | body state: u8 |
//! header count: u16 | per header: u16 name len + name + u32 value len + value |
//! body: u32 len + bytes (only when the body state is "stored") |
//! trailer count: u16 | per trailer: as a header.
//!
//! A response without trailers is written as `"DGR2"`: the same layout without the trailer
//! section. Any other start is refused (`record-unusable`), never replayed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};

use crate::protocol::tokens::StoreKey;

const MAGIC: &[u8; 4] = b"DGR3";
/// The same layout without the trailer section, for a response that has none.
const MAGIC_V2: &[u8; 4] = b"DGR2";

/// What happened to the upstream's body when the record was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredBody {
    /// The whole body, replayed byte for byte.
    Stored(Bytes),
    /// Larger than the route's `max_cached_body`: delivered to the first client only.
    TooLarge,
    /// The upstream answered but its body broke off or timed out: the effect happened,
    /// the response cannot be replayed.
    Incomplete,
    /// The route keeps no bodies (`store_body = false`): only the outcome is stored.
    NotStored,
}

/// An upstream response as stored for replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// Upstream status.
    pub status: StatusCode,
    /// Upstream headers, minus hop-by-hop headers, `Set-Cookie` and the route's
    /// `replay_drop_headers`.
    pub headers: HeaderMap,
    /// Upstream body.
    pub body: StoredBody,
    /// When the store forgets the key (completion plus the window), to the second.
    pub expires: Option<SystemTime>,
    /// The body's trailer section (HTTP/2 trailers, HTTP/1.1 chunked trailers: gRPC's
    /// `grpc-status` and `grpc-message`); empty when there was none.
    pub trailers: HeaderMap,
}

/// Why a stored record could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Truncated, wrong magic, or a field out of range.
    #[error("stored record is corrupt: {0}")]
    Corrupt(&'static str),
    /// The record belongs to another key: never replay it.
    #[error("stored record belongs to another key")]
    WrongKey,
}

impl StoredResponse {
    /// Encodes the response under `key`.
    pub fn encode(&self, key: &StoreKey) -> Bytes {
        let fields = Fields {
            size: map_size(&self.headers),
            headers: map_fields(&self.headers),
            trailers: &self.trailers,
        };
        encode(key, self.status, fields, &self.body, self.expires)
    }

    /// Decodes a record, refusing it unless it was stored under `expected_key`.
    /// The body is a zero-copy slice of `bytes`.
    pub fn decode(bytes: &Bytes, expected_key: &StoreKey) -> Result<Self, RecordError> {
        let (mut r, start) = Reader::open(bytes, expected_key)?;
        // Room for the two fields a replay adds (`Idempotent-Replayed`, `Idempotency-Expires`):
        // a map sized to the stored ones grew, rehashing them all, to take those.
        let headers = r.fields(2)?;
        let body = r.body(bytes, start.state)?;
        let trailers = match start.version {
            3 => r.fields(0)?,
            _ => HeaderMap::new(),
        };
        r.end()?;
        Ok(Self {
            status: start.status,
            headers,
            body,
            expires: start.expires,
            trailers,
        })
    }
}

/// A field as a record keeps it: its name (lower case) and its value.
pub type Field<'a> = (&'a [u8], &'a [u8]);

/// The fields of a response as a record keeps them: its headers (those a replay keeps: the
/// caller leaves out what the replay policy drops as it goes, so nothing is copied), and
/// its trailers.
pub struct Fields<'a, H> {
    /// The response's headers.
    pub headers: H,
    /// About how many bytes they take in the record (see [`map_size`]): the record is
    /// sized for it, and grows if they take more.
    pub size: usize,
    /// The body's trailer section (empty when there was none).
    pub trailers: &'a HeaderMap,
}

/// The fields of a header map, as [`Fields::headers`] takes them.
pub fn map_fields(map: &HeaderMap) -> impl Iterator<Item = Field<'_>> {
    map.iter()
        .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
}

/// How many bytes the fields of `map` take in a record.
pub fn map_size(map: &HeaderMap) -> usize {
    map.iter()
        .map(|(n, v)| 6 + n.as_str().len() + v.len())
        .sum()
}

/// Encodes a response under `key` as [`StoredResponse::encode`] does, from its fields as
/// the caller gives them (a header map's, less those the replay policy drops, with no
/// copy of the map).
pub fn encode<'h>(
    key: &StoreKey,
    status: StatusCode,
    fields: Fields<'_, impl Iterator<Item = Field<'h>>>,
    body: &StoredBody,
    expires: Option<SystemTime>,
) -> Bytes {
    let key = key.as_str();
    let body_len = match body {
        StoredBody::Stored(b) => b.len(),
        _ => 0,
    };
    let headers_len = fields.size + 2 + map_size(fields.trailers);
    let mut out = BytesMut::with_capacity(4 + 2 + key.len() + 8 + 5 + headers_len + 4 + body_len);
    let with_trailers = !fields.trailers.is_empty();
    out.put_slice(if with_trailers { MAGIC } else { MAGIC_V2 });
    put_u16_bytes(&mut out, key.as_bytes());
    out.put_u64(
        expires
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs()),
    );
    out.put_u16(status.as_u16());
    out.put_u8(match body {
        StoredBody::Stored(_) => 0,
        StoredBody::TooLarge => 1,
        StoredBody::Incomplete => 2,
        StoredBody::NotStored => 3,
    });
    put_fields(&mut out, fields.headers);
    if let StoredBody::Stored(b) = body {
        out.put_u32(b.len() as u32);
        out.put_slice(b);
    }
    if with_trailers {
        put_fields(&mut out, map_fields(fields.trailers));
    }
    out.freeze()
}

/// A header or trailer section: its count (written once the fields are), then each field
/// (at most `u16::MAX`). A framing or hop-by-hop field is never stored
/// ([`crate::protocol::hop_by_hop::is_framing`]): whoever replays the record frames it anew.
fn put_fields<'h>(out: &mut BytesMut, fields: impl Iterator<Item = Field<'h>>) {
    let at = out.len();
    out.put_u16(0);
    let mut count: u16 = 0;
    let fields = fields.filter(|(name, _)| !crate::protocol::hop_by_hop::is_framing(name));
    for (name, value) in fields.take(u16::MAX as usize) {
        put_u16_bytes(out, name);
        out.put_u32(value.len() as u32);
        out.put_slice(value);
        count += 1;
    }
    out[at..at + 2].copy_from_slice(&count.to_be_bytes());
}

fn put_u16_bytes(out: &mut BytesMut, b: &[u8]) {
    // Keys are at most 255 bytes plus a bounded namespace; header names are short.
    let len = b.len().min(u16::MAX as usize);
    out.put_u16(len as u16);
    out.put_slice(&b[..len]);
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// The most fields a decoded section's map is sized for up front (it grows past that).
const MAP_ROOM: usize = 256;

/// What a record says before its fields.
struct Start {
    version: u8,
    expires: Option<SystemTime>,
    status: StatusCode,
    /// The body's state byte.
    state: u8,
}

impl<'a> Reader<'a> {
    /// Reads a record's start, refusing it unless it was stored under `expected_key`.
    fn open(bytes: &'a Bytes, expected_key: &StoreKey) -> Result<(Self, Start), RecordError> {
        let expected_key = expected_key.as_str();
        let mut r = Reader { buf: bytes, pos: 0 };
        let version = match r.take(4)? {
            m if m == MAGIC => 3,
            m if m == MAGIC_V2 => 2,
            _ => return Err(RecordError::Corrupt("bad magic")),
        };
        let key_len = r.u16()? as usize;
        if r.take(key_len)? != expected_key.as_bytes() {
            return Err(RecordError::WrongKey);
        }
        let expires = match r.u64()? {
            0 => None,
            secs => Some(
                UNIX_EPOCH
                    .checked_add(Duration::from_secs(secs))
                    .ok_or(RecordError::Corrupt("bad expiry"))?,
            ),
        };
        let status =
            StatusCode::from_u16(r.u16()?).map_err(|_| RecordError::Corrupt("bad status"))?;
        let state = r.u8()?;
        let start = Start {
            version,
            expires,
            status,
            state,
        };
        Ok((r, start))
    }

    /// The body, in the state `state` says (a stored one a zero-copy slice of `bytes`).
    fn body(&mut self, bytes: &Bytes, state: u8) -> Result<StoredBody, RecordError> {
        Ok(match state {
            0 => {
                let len = self.u32()? as usize;
                let start = self.pos;
                self.take(len)?;
                StoredBody::Stored(bytes.slice(start..start + len))
            }
            1 => StoredBody::TooLarge,
            2 => StoredBody::Incomplete,
            3 => StoredBody::NotStored,
            _ => return Err(RecordError::Corrupt("bad body state")),
        })
    }

    /// Nothing may follow the record's last section.
    fn end(&self) -> Result<(), RecordError> {
        if self.pos != self.buf.len() {
            return Err(RecordError::Corrupt("trailing bytes"));
        }
        Ok(())
    }

    /// Each field of a section, given to `each`.
    fn section(
        &mut self,
        mut each: impl FnMut(&'a [u8], &'a [u8]) -> Result<(), RecordError>,
    ) -> Result<(), RecordError> {
        let count = self.u16()? as usize;
        for _ in 0..count {
            let name_len = self.u16()? as usize;
            let name = self.take(name_len)?;
            let value_len = self.u32()? as usize;
            each(name, self.take(value_len)?)?;
        }
        Ok(())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(RecordError::Corrupt("truncated"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, RecordError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, RecordError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A section of fields, in a map with room for `extra` more.
    fn fields(&mut self, extra: usize) -> Result<HeaderMap, RecordError> {
        let at = self.pos;
        let count = self.u16()? as usize;
        self.pos = at;
        // A hostile count must not size the map (`HeaderMap` panics past about 24,000):
        // each field takes at least six bytes of what is left, and the map is sized for
        // a real head's count at most; one that holds more than a map can is corrupt.
        let room = count.min((self.buf.len() - self.pos) / 6).min(MAP_ROOM) + extra;
        let mut fields = HeaderMap::with_capacity(room);
        let too_many = || RecordError::Corrupt("more fields than a header map holds");
        self.section(|name, value| {
            let name = HeaderName::from_bytes(name)
                .map_err(|_| RecordError::Corrupt("bad header name"))?;
            let value = HeaderValue::from_bytes(value)
                .map_err(|_| RecordError::Corrupt("bad header value"))?;
            // A framing field is never replayed.
            if !crate::protocol::hop_by_hop::is_framing(name.as_str().as_bytes()) {
                fields.try_append(name, value).map_err(|_| too_many())?;
            }
            Ok(())
        })?;
        Ok(fields)
    }
    fn u64(&mut self) -> Result<u64, RecordError> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(b))
    }
}

#[cfg(test)]
mod tests;
