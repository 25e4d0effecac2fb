//! Out-of-order versions: which entity a request writes and which version of it (pure).
//!
//! An ordered route names two request parts: the entity (`json:/data/id`) and its version
//! (`json:/data/version`). The store keeps, per entity, the highest version completed;
//! a request whose version is not greater is stale and never forwarded. Versions are
//! turned here into a comparable encoding, so every backend compares them the same way,
//! as bytes: an integer or an instant as 16 hex digits of its bits with the sign bit
//! flipped (order-preserving across negative values), a string as its UTF-8 bytes.

use sha2::{Digest, Sha256};

use super::{field, json, KeyError, RequestPart, RequestView};
use crate::protocol::tokens::StoreKey;

/// How two versions of one entity compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Compare {
    /// Signed 64-bit integers (a JSON number or a string holding one).
    Integer,
    /// RFC 3339 timestamps (`Z` or an offset, from 1970 on), compared as instants to the
    /// millisecond.
    Timestamp,
    /// Strings, compared byte by byte (UTF-8).
    String,
}

/// A route's `order = { entity, version, compare }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRule {
    /// The part that names the entity written.
    pub entity: RequestPart,
    /// The part that carries its version.
    pub version: RequestPart,
    /// How versions compare.
    pub compare: Compare,
}

/// One request's place in its entity's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordered {
    /// Hash of the entity's value: 32 hex characters.
    pub entity: String,
    /// The version, encoded so that byte order is version order.
    pub version: Vec<u8>,
    /// The version as the request spelled it, for logs and operators.
    pub shown: String,
}

/// Longest string version accepted, in bytes.
pub const MAX_VERSION_LEN: usize = 255;

impl OrderRule {
    /// The entity and version of a request; a 400 when either is absent or unusable.
    pub fn derive(&self, req: &RequestView<'_>) -> Result<Ordered, KeyError> {
        let entity = entity_hash(&part_value(&self.entity, req)?);
        let raw = part_value(&self.version, req)?;
        let bad = |why: &str| KeyError::BadVersion(format!("{}: {why}", self.version));
        // A number or an instant is parsed, so white space around it changes nothing; a
        // string version is compared as sent: `"b "` and `"b"` are two versions, as trimming
        // would make a later version equal to an earlier one, and so stale.
        let text = match self.compare {
            Compare::String => String::from_utf8_lossy(&raw).into_owned(),
            _ => String::from_utf8_lossy(&raw).trim().to_owned(),
        };
        let version = match self.compare {
            Compare::Integer => {
                let n: i64 = text.parse().map_err(|_| bad("not a 64-bit integer"))?;
                flip(n)
            }
            Compare::Timestamp => {
                flip(parse_rfc3339_ms(&text).ok_or_else(|| bad("not an RFC 3339 timestamp"))?)
            }
            Compare::String => {
                if raw.len() > MAX_VERSION_LEN {
                    return Err(bad("longer than 255 bytes"));
                }
                // The bytes as sent: two spellings never compare equal by a lossy decoding.
                raw
            }
        };
        Ok(Ordered {
            entity,
            version,
            shown: text.chars().take(64).collect(),
        })
    }
}

/// The entity's hash (32 hex characters) from its value: a JSON string's content, any
/// other JSON value's canonical text, or a header's value. An operator names an ordered
/// route's record on a cluster by the entity's value (`entity=` on the admin API).
pub fn entity_hash(value: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"dedupe-gateway/entity/v1");
    field(&mut h, Some(value));
    hex::encode(&h.finalize()[..16])
}

/// The store key of an entity's order record: beside the route's records, in its own
/// namespace (`=entity:`), so it never equals a record's key. Its hash tag is the entity's:
/// on a Redis Cluster the order record and the records that write the entity share a slot,
/// so one script may touch both.
pub fn entity_key(prefix: &str, route: &str, scope: &str, entity: &str) -> StoreKey {
    super::compose(prefix, route, scope, entity, &format!("=entity:{entity}"))
}

/// The store key of a request's record. With `entity` (an ordered route on a Redis
/// Cluster), its hash tag is the entity's, so the record and the entity's order record
/// share a slot; otherwise it is [`super::store_key`]. A cluster thus keeps one entity's
/// records on one node: fine for the versions of one entity, written one at a time anyway.
pub fn record_key(
    prefix: &str,
    route: &str,
    scope: &str,
    key: &str,
    entity: Option<&str>,
) -> StoreKey {
    super::compose(prefix, route, scope, entity.unwrap_or(key), key)
}

/// A version in its comparable encoding as an operator reads it: the integer, the instant
/// (RFC 3339, UTC), or the string.
pub fn show(compare: Compare, encoded: &[u8]) -> String {
    let unflip = || {
        let hex = std::str::from_utf8(encoded).ok()?;
        Some((u64::from_str_radix(hex, 16).ok()? ^ (1 << 63)) as i64)
    };
    match compare {
        Compare::String => String::from_utf8_lossy(encoded).into_owned(),
        Compare::Integer => unflip().map_or_else(String::new, |n| n.to_string()),
        Compare::Timestamp => unflip()
            .and_then(|ms| u64::try_from(ms).ok())
            .map(|ms| std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
            .map_or_else(String::new, |t| {
                humantime::format_rfc3339_millis(t).to_string()
            }),
    }
}

/// An i64 as 16 hex digits whose byte order is numeric order.
fn flip(n: i64) -> Vec<u8> {
    format!("{:016x}", (n as u64) ^ (1 << 63)).into_bytes()
}

/// The value of one part: a JSON string's content (unescaped), any other JSON value's
/// canonical text, a header's value (the first, refusing several).
fn part_value(part: &RequestPart, req: &RequestView<'_>) -> Result<Vec<u8>, KeyError> {
    let missing = || KeyError::MissingPart(part.to_string());
    match part {
        RequestPart::Method => Ok(req.method.as_str().as_bytes().to_vec()),
        RequestPart::Path => Ok(req.path.as_bytes().to_vec()),
        RequestPart::Query => req.query.map(|q| q.as_bytes().to_vec()).ok_or_else(missing),
        RequestPart::Body => Ok(req.body.to_vec()),
        RequestPart::Header(name) => {
            let mut values = req.headers.get_all(name).iter();
            let v = values.next().ok_or_else(missing)?;
            if values.next().is_some() {
                return Err(KeyError::BadVersion(format!("{part}: sent more than once")));
            }
            Ok(v.as_bytes().to_vec())
        }
        RequestPart::Json(pointer) => {
            let doc = json::parse(req.body).map_err(|e| match e {
                json::JsonError::Syntax(e) => KeyError::MalformedJson(e),
                json::JsonError::DuplicateKey(k) => {
                    KeyError::DuplicateJsonKey(k.chars().take(64).collect())
                }
            })?;
            let v = doc.pointer(pointer).ok_or_else(missing)?;
            Ok(match v {
                json::Value::Str(s) => s.as_bytes().to_vec(),
                other => {
                    let mut out = Vec::new();
                    other.canonical(&mut out);
                    out
                }
            })
        }
    }
}

/// Milliseconds since the epoch of an RFC 3339 timestamp (`Z` or a `±hh:mm` offset).
/// `t`, `z` and a space between date and time are accepted (RFC 3339 §5.6 allows each). A
/// leap second (`23:59:60`) is refused: to the millisecond it would equal another instant,
/// and the later of two versions that compare equal is stale.
fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let mut owned;
    let mut s = s;
    if matches!(s.as_bytes().get(10), Some(b't' | b' ')) {
        owned = s.to_owned();
        owned.replace_range(10..11, "T");
        s = &owned;
    }
    if s.get(16..19) == Some(":60") {
        return None;
    }
    let (local, offset_min) = if let Some(l) = s.strip_suffix(['Z', 'z']) {
        (l, 0i64)
    } else {
        let at = s.len().checked_sub(6)?;
        let (l, off) = (s.get(..at)?, s.get(at..)?);
        let sign = match off.as_bytes()[0] {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        if off.as_bytes()[3] != b':' {
            return None;
        }
        let h: i64 = off.get(1..3)?.parse().ok()?;
        let m: i64 = off.get(4..6)?.parse().ok()?;
        if h > 23 || m > 59 {
            return None;
        }
        (l, sign * (h * 60 + m))
    };
    let t = humantime::parse_rfc3339(&format!("{local}Z")).ok()?;
    let ms = match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).ok()?,
        Err(e) => -i64::try_from(e.duration().as_millis()).ok()?,
    };
    Some(ms - offset_min * 60_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, Method};

    fn derive(rule: &OrderRule, body: &str) -> Result<Ordered, KeyError> {
        let headers = HeaderMap::new();
        rule.derive(&RequestView {
            method: &Method::POST,
            path: "/e",
            query: None,
            headers: &headers,
            body: body.as_bytes(),
        })
    }

    fn rule(compare: Compare) -> OrderRule {
        OrderRule {
            entity: RequestPart::Json("/id".into()),
            version: RequestPart::Json("/v".into()),
            compare,
        }
    }

    #[test]
    fn integers_compare_numerically_as_bytes() {
        let r = rule(Compare::Integer);
        let v = |v: &str| {
            derive(&r, &format!(r#"{{"id":1,"v":{v}}}"#))
                .unwrap()
                .version
        };
        assert!(v("-5") < v("-1"));
        assert!(v("-1") < v("0"));
        assert!(v("9") < v("10"));
        assert!(v("10") < v("\"11\""));
        assert_eq!(v("7"), v("\"7\""));
        assert!(matches!(
            derive(&r, r#"{"id":1,"v":1.5}"#),
            Err(KeyError::BadVersion(_))
        ));
        assert!(matches!(
            derive(&r, r#"{"id":1}"#),
            Err(KeyError::MissingPart(_))
        ));
    }

    #[test]
    fn encoded_versions_show_as_written() {
        let r = rule(Compare::Integer);
        let v = derive(&r, r#"{"id":1,"v":-42}"#).unwrap();
        assert_eq!(show(Compare::Integer, &v.version), "-42");
        let r = rule(Compare::Timestamp);
        let v = derive(&r, r#"{"id":1,"v":"2026-01-01T12:00:00+02:00"}"#).unwrap();
        assert_eq!(
            show(Compare::Timestamp, &v.version),
            "2026-01-01T10:00:00.000Z"
        );
        assert_eq!(show(Compare::String, b"v7"), "v7");
    }

    #[test]
    fn timestamps_compare_as_instants() {
        let r = rule(Compare::Timestamp);
        let v = |v: &str| {
            derive(&r, &format!(r#"{{"id":1,"v":"{v}"}}"#))
                .unwrap()
                .version
        };
        assert_eq!(v("2026-01-01T10:00:00Z"), v("2026-01-01T12:00:00+02:00"));
        assert!(v("2026-01-01T10:00:00Z") < v("2026-01-01T10:00:00.001Z"));
        assert!(v("1970-01-01T00:00:00Z") < v("1970-01-01T00:00:01Z"));
        // Before 1970 is outside what the gateway accepts (humantime's range).
        assert!(matches!(
            derive(&r, r#"{"id":1,"v":"1969-12-31T23:59:59Z"}"#),
            Err(KeyError::BadVersion(_))
        ));
        assert!(v("2026-01-01T10:00:00-01:00") > v("2026-01-01T10:30:00Z"));
        assert!(matches!(
            derive(&r, r#"{"id":1,"v":"yesterday"}"#),
            Err(KeyError::BadVersion(_))
        ));
    }

    #[test]
    fn timestamp_spellings_rfc_3339_allows_are_one_instant_and_leap_seconds_are_refused() {
        let r = rule(Compare::Timestamp);
        let v = |v: &str| derive(&r, &format!(r#"{{"id":1,"v":"{v}"}}"#)).map(|o| o.version);
        let t = v("2026-01-01T10:00:00Z").unwrap();
        for same in [
            "2026-01-01t10:00:00z",
            "2026-01-01 10:00:00Z",
            " 2026-01-01T10:00:00Z ",
        ] {
            assert_eq!(v(same).unwrap(), t, "{same}");
        }
        for leap in ["2016-12-31T23:59:60Z", "2016-12-31T23:59:60.5+00:00"] {
            assert!(matches!(v(leap), Err(KeyError::BadVersion(_))), "{leap}");
        }
    }

    #[test]
    fn string_versions_compare_as_sent_and_a_number_entity_is_its_string() {
        let r = rule(Compare::String);
        let v = |v: &str| derive(&r, &format!(r#"{{"id":1,"v":"{v}"}}"#)).unwrap();
        assert_ne!(v("b ").version, v("b").version);
        assert!(v("b").version < v("b ").version);
        // Decided: an entity sent as 42 and as "42" is one entity (one customer whose id
        // two senders spell differently), so its versions are ordered together.
        let n = derive(&r, r#"{"id":42,"v":"a"}"#).unwrap();
        let s = derive(&r, r#"{"id":"42","v":"a"}"#).unwrap();
        assert_eq!(n.entity, s.entity);
    }

    #[test]
    fn strings_compare_bytewise_and_entities_hash_their_value() {
        let r = rule(Compare::String);
        let a = derive(&r, r#"{"id":"x","v":"a"}"#).unwrap();
        let b = derive(&r, r#"{"id":"x","v":"ab"}"#).unwrap();
        let c = derive(&r, r#"{"id":"y","v":"b"}"#).unwrap();
        assert!(a.version < b.version && b.version < c.version);
        assert_eq!(a.entity, b.entity);
        assert_ne!(a.entity, c.entity);
        assert_eq!(a.entity.len(), 32);
    }

    #[test]
    fn on_a_cluster_records_share_their_entitys_slot() {
        let tag = |k: &StoreKey| k.as_str().split(':').nth(1).unwrap().to_owned();
        let entity = entity_key("dd", "r", "-", "e1");
        let a = record_key("dd", "r", "-", "key-a", Some("e1"));
        let b = record_key("dd", "r", "-", "key-b", Some("e1"));
        assert_eq!(tag(&a), tag(&entity));
        assert_eq!(tag(&b), tag(&entity));
        let other = record_key("dd", "r", "-", "key-a", Some("e2"));
        assert_ne!(tag(&other), tag(&entity));
        assert_eq!(
            record_key("dd", "r", "-", "key-a", None),
            super::super::store_key("dd", "r", "-", "key-a")
        );
        assert!(a.as_str().ends_with(":r:-:key-a"), "{a}");
    }

    #[test]
    fn entity_keys_are_namespaced_apart_from_records() {
        let k = entity_key("dd", "r", "-", "abc");
        assert!(k.as_str().contains(":=entity:abc"), "{k}");
        assert_ne!(k, super::super::store_key("dd", "r", "-", "=entity:abc"));
    }
}
