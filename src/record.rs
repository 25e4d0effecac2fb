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
//! A response without trailers is written as `"DGR2"` (the same layout without the trailer
//! section), so a gateway of the release before trailers, mid-upgrade in the same fleet,
//! still replays every record but those with trailers (which it answers `record-unusable`
//! rather than replay without them). `"DGR1"` records (no expiry field either), written
//! before `Idempotency-Expires`, still decode.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};

use crate::tokens::StoreKey;

const MAGIC: &[u8; 4] = b"DGR3";
/// The layout before the trailer section.
const MAGIC_V2: &[u8; 4] = b"DGR2";
/// The layout before the expiry field.
const MAGIC_V1: &[u8; 4] = b"DGR1";

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

/// A record read without a header map: its status, body and expiry, its header fields
/// handed one by one to the reader ([`FieldRecord::decode`]). What the lane writes a
/// replay from: the fields go to the client as lines, never into a map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRecord {
    /// The stored status.
    pub status: StatusCode,
    /// The stored body.
    pub body: StoredBody,
    /// When the store forgets the key.
    pub expires: Option<SystemTime>,
}

impl FieldRecord {
    /// Decodes a record as [`StoredResponse::decode`] does, with the same checks (a field
    /// name or value a header map would refuse makes the record corrupt), each header
    /// field given to `each` (its name as stored: lower case from every writer, but a
    /// header map takes any case, so this does too). `Ok(None)` for a record with
    /// trailers, which only a header map's response carries; `each` may have seen its
    /// fields by then.
    pub fn decode(
        bytes: &Bytes,
        expected_key: &StoreKey,
        mut each: impl FnMut(&[u8], &[u8]),
    ) -> Result<Option<Self>, RecordError> {
        let (mut r, start) = Reader::open(bytes, expected_key)?;
        r.section(|name, value| {
            if name.is_empty() || !name.iter().all(|&b| is_token(b)) {
                return Err(RecordError::Corrupt("bad header name"));
            }
            if !value
                .iter()
                .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
            {
                return Err(RecordError::Corrupt("bad header value"));
            }
            each(name, value);
            Ok(())
        })?;
        let body = r.body(bytes, start.state)?;
        if start.version == 3 && r.u16()? != 0 {
            return Ok(None);
        }
        r.end()?;
        Ok(Some(Self {
            status: start.status,
            body,
            expires: start.expires,
        }))
    }
}

/// A byte `HeaderName` takes in a name: a token character (RFC 9110 §5.6.2).
fn is_token(b: u8) -> bool {
    matches!(b, b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*'
        | b'+' | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~')
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

/// Encodes a response under `key` as [`StoredResponse::encode`] does, from its fields
/// wherever they are: a header map, or a head already written for the client (the
/// lane's winner, whose answer never becomes a header map).
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
/// (at most `u16::MAX`).
fn put_fields<'h>(out: &mut BytesMut, fields: impl Iterator<Item = Field<'h>>) {
    let at = out.len();
    out.put_u16(0);
    let mut count: u16 = 0;
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
            m if m == MAGIC_V1 => 1,
            _ => return Err(RecordError::Corrupt("bad magic")),
        };
        let key_len = r.u16()? as usize;
        if r.take(key_len)? != expected_key.as_bytes() {
            return Err(RecordError::WrongKey);
        }
        let expires = match version >= 2 {
            true => match r.u64()? {
                0 => None,
                secs => Some(
                    UNIX_EPOCH
                        .checked_add(Duration::from_secs(secs))
                        .ok_or(RecordError::Corrupt("bad expiry"))?,
                ),
            },
            false => None,
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
            fields.try_append(name, value).map_err(|_| too_many())?;
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
mod tests {
    use super::*;

    fn sample(body: StoredBody) -> StoredResponse {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-multi", HeaderValue::from_static("1"));
        headers.append("x-multi", HeaderValue::from_static("2"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("3"));
        trailers.insert("grpc-message", HeaderValue::from_static("bad%20amount"));
        StoredResponse {
            status: StatusCode::CREATED,
            headers,
            body,
            expires: Some(UNIX_EPOCH + Duration::from_secs(1_900_000_000)),
            trailers,
        }
    }

    #[test]
    fn fields_left_out_as_it_is_written_make_the_record_of_the_map_without_them() {
        let r = sample(StoredBody::Stored(Bytes::from_static(b"hi")));
        let k = StoreKey::from_raw("k");
        let fields = Fields {
            headers: map_fields(&r.headers).filter(|(n, _)| *n != b"x-multi"),
            size: 0,
            trailers: &r.trailers,
        };
        let written = encode(&k, r.status, fields, &r.body, r.expires);
        let mut without = r.clone();
        without.headers.remove("x-multi");
        assert_eq!(written, without.encode(&k));
        assert_eq!(StoredResponse::decode(&written, &k).unwrap(), without);
    }

    /// A record's fields as [`FieldRecord::decode`] gives them, in a header map.
    fn fields_of(
        bytes: &Bytes,
        k: &StoreKey,
    ) -> Result<Option<(FieldRecord, HeaderMap)>, RecordError> {
        let mut map = HeaderMap::new();
        let read = FieldRecord::decode(bytes, k, |name, value| {
            map.append(
                HeaderName::from_bytes(name).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        })?;
        Ok(read.map(|r| (r, map)))
    }

    #[test]
    fn a_record_decodes_field_by_field_as_into_a_header_map() {
        let k = StoreKey::from_raw("k");
        let mut r = sample(StoredBody::Stored(Bytes::from_static(b"hi")));
        r.trailers = HeaderMap::new();
        r.headers.insert(
            "date",
            HeaderValue::from_static("Thu, 01 Jan 2026 00:00:00 GMT"),
        );
        let (read, fields) = fields_of(&r.encode(&k), &k).unwrap().unwrap();
        assert_eq!(fields, r.headers);
        assert_eq!(
            (read.status, &read.body, read.expires),
            (r.status, &r.body, r.expires)
        );
        // With trailers: only a header map's response carries them.
        let with = sample(StoredBody::Stored(Bytes::from_static(b"hi")));
        assert_eq!(
            FieldRecord::decode(&with.encode(&k), &k, |_, _| {}),
            Ok(None)
        );
        // A name or value a header map refuses makes the record corrupt either way.
        for (name, value) in [("x y", "1"), ("", "1"), ("x", "a\rb"), ("x", "a\u{7f}")] {
            let mut bad = r.clone();
            bad.headers = HeaderMap::new();
            let mut enc = BytesMut::new();
            put_fields(&mut enc, [(name.as_bytes(), value.as_bytes())].into_iter());
            let good = r.encode(&k);
            let fields_at = 4 + 2 + 1 + 8 + 2 + 1;
            let rest = {
                let (mut rd, _) = Reader::open(&good, &k).unwrap();
                rd.fields(0).unwrap();
                rd.pos
            };
            let mut record = good[..fields_at].to_vec();
            record.extend_from_slice(&enc);
            record.extend_from_slice(&good[rest..]);
            let record = Bytes::from(record);
            assert!(
                StoredResponse::decode(&record, &k).is_err(),
                "{name:?} {value:?}"
            );
            assert!(
                FieldRecord::decode(&record, &k, |_, _| {}).is_err(),
                "{name:?} {value:?}"
            );
        }
    }

    #[test]
    fn a_response_without_trailers_is_written_as_version_2() {
        let mut r = sample(StoredBody::Stored(Bytes::from_static(b"hi")));
        r.trailers = HeaderMap::new();
        let k = StoreKey::from_raw("k");
        // DGR2, the layout a gateway of the release before trailers reads.
        let v2 = r.encode(&k);
        assert_eq!(&v2[..4], b"DGR2");
        assert_eq!(StoredResponse::decode(&v2, &k).unwrap(), r);
        // A DGR3 record with an empty trailer section still decodes.
        let mut v3 = v2.to_vec();
        v3[..4].copy_from_slice(b"DGR3");
        v3.extend_from_slice(&[0, 0]);
        assert_eq!(StoredResponse::decode(&Bytes::from(v3), &k).unwrap(), r);
        // Trailers with an empty body, as a gRPC error answer has: DGR3.
        let mut grpc = sample(StoredBody::Stored(Bytes::new()));
        grpc.headers = HeaderMap::new();
        let v3 = grpc.encode(&k);
        assert_eq!(&v3[..4], b"DGR3");
        assert_eq!(StoredResponse::decode(&v3, &k).unwrap(), grpc);
    }

    #[test]
    fn round_trips_every_body_state() {
        for body in [
            StoredBody::Stored(Bytes::from_static(b"{\"id\":1}")),
            StoredBody::Stored(Bytes::new()),
            StoredBody::TooLarge,
            StoredBody::Incomplete,
            StoredBody::NotStored,
        ] {
            let r = sample(body);
            let enc = r.encode(&StoreKey::from_raw("dedupe:{x}:r:-:k"));
            assert_eq!(
                StoredResponse::decode(&enc, &StoreKey::from_raw("dedupe:{x}:r:-:k")).unwrap(),
                r
            );
        }
    }

    #[test]
    fn an_unknown_expiry_round_trips_and_version_1_records_still_decode() {
        let mut r = sample(StoredBody::TooLarge);
        r.expires = None;
        let k = StoreKey::from_raw("k");
        assert_eq!(StoredResponse::decode(&r.encode(&k), &k).unwrap(), r);
        // A DGR1 record: the same layout without the expiry field.
        let mut v1 = b"DGR1".to_vec();
        v1.extend_from_slice(&[0, 1, b'k', 0, 201, 1, 0, 0]);
        let decoded = StoredResponse::decode(&Bytes::from(v1), &k).unwrap();
        assert_eq!(decoded.status, StatusCode::CREATED);
        assert_eq!(decoded.body, StoredBody::TooLarge);
        assert_eq!(decoded.expires, None);
    }

    #[test]
    fn refuses_a_record_of_another_key() {
        let enc = sample(StoredBody::TooLarge).encode(&StoreKey::from_raw("k1"));
        assert_eq!(
            StoredResponse::decode(&enc, &StoreKey::from_raw("k2")),
            Err(RecordError::WrongKey)
        );
        assert_eq!(
            StoredResponse::decode(&enc, &StoreKey::from_raw("k")),
            Err(RecordError::WrongKey)
        );
    }

    #[test]
    fn refuses_corrupt_records_without_panicking() {
        let enc = sample(StoredBody::Stored(Bytes::from_static(b"hello")))
            .encode(&StoreKey::from_raw("k"));
        for cut in 0..enc.len() {
            assert!(
                StoredResponse::decode(&enc.slice(..cut), &StoreKey::from_raw("k")).is_err(),
                "cut at {cut}"
            );
        }
        let mut extra = enc.to_vec();
        extra.push(0);
        assert!(StoredResponse::decode(&Bytes::from(extra), &StoreKey::from_raw("k")).is_err());
        assert!(
            StoredResponse::decode(&Bytes::from_static(b"nope"), &StoreKey::from_raw("k")).is_err()
        );
    }

    #[test]
    fn a_hostile_field_count_in_a_large_record_is_refused_without_panicking() {
        // A count of 65,535 where a header map holds about 24,000, and bytes enough that
        // the count is not ruled out by the record's length alone.
        let k = StoreKey::from_raw("k");
        let mut record = b"DGR2".to_vec();
        record.extend_from_slice(&[0, 1, b'k']);
        record.extend_from_slice(&[0; 8]);
        record.extend_from_slice(&[0, 200, 0, 0xff, 0xff]);
        for i in 0..40_000u32 {
            let name = format!("x{i}");
            record.extend_from_slice(&(name.len() as u16).to_be_bytes());
            record.extend_from_slice(name.as_bytes());
            record.extend_from_slice(&1u32.to_be_bytes());
            record.push(b'v');
        }
        let record = Bytes::from(record);
        assert!(StoredResponse::decode(&record, &k).is_err());
        assert!(FieldRecord::decode(&record, &k, |_, _| {}).is_err());
    }

    #[test]
    fn random_bytes_never_panic() {
        // A fixed xorshift stream: hostile or corrupted store contents must decode to an
        // error, never a panic or a replay.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let valid = sample(StoredBody::Stored(Bytes::from_static(b"body")))
            .encode(&StoreKey::from_raw("k"));
        for round in 0u32..5000 {
            let mut bytes = if round.is_multiple_of(2) {
                valid.to_vec()
            } else {
                b"DGR1".to_vec()
            };
            let len = (x % 64) as usize;
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x as usize) % (bytes.len() + 1);
                if at < bytes.len() && x.is_multiple_of(3) {
                    bytes[at] = (x >> 8) as u8;
                } else {
                    bytes.insert(at.min(bytes.len()), (x >> 16) as u8);
                }
            }
            let bytes = Bytes::from(bytes);
            let k = StoreKey::from_raw("k");
            let map = StoredResponse::decode(&bytes, &k);
            // The lines agree with the map: both refuse, or both read the same.
            match fields_of(&bytes, &k) {
                Ok(Some((read, fields))) => {
                    let map = map.expect("the map reads what the fields read");
                    assert_eq!(fields, map.headers);
                    assert_eq!((read.status, read.body), (map.status, map.body));
                }
                // Trailers, which only the map carries (or a corrupt trailer section).
                Ok(None) => assert!(map.map_or(true, |m| !m.trailers.is_empty())),
                Err(e) => assert_eq!(map.err(), Some(e)),
            }
        }
    }
}
