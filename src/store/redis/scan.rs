//! Listing records on Redis (see [`crate::store::listing`]): `SCAN ... MATCH <prefix>:{*}:*
//! COUNT n` on the one server or on each master of a cluster in turn, and each batch's
//! records read with one pipeline of `HMGET`s (after a `TIME`, for the leases): an ordered
//! route's records are hashes. A plain route's record, a string, answers `HMGET` with
//! `WRONGTYPE`; those are read with one more pipeline of `GET` and `PEXPIRETIME`. No Lua: a listing
//! only reads, and a state that changes between the `SCAN` and the read is shown as the
//! read found it.

use redis::cluster_routing::SingleNodeRoutingInfo;

use super::*;
use crate::store::listing::{self, Cursor, ListRequest, Listed, Listing, MAX_SCANNED, SCAN_COUNT};
use crate::store::{Fence, RecordState};

/// The fields of a record a listing reads: state, fence, lease end, hold, attempts, and
/// when the current claim won.
const FIELDS: [&str; 6] = ["s", "f", "l", "k", "a", "t"];

/// A record as a listing shows it, from its [`FIELDS`] (`now_ms`: the server's clock);
/// `None` for a key that holds no record (an entity's order record, a vanished key). The
/// one place a hash record's state is read outside the scripts.
fn decode(store_key: &str, prefix: &str, fields: &Value, now_ms: i64) -> Option<Listed> {
    let Value::Array(f) = fields else {
        return None;
    };
    let s = f.first().and_then(topology::text)?;
    let lease_end = f.get(2).and_then(int);
    let in_flight = s == "i";
    let lease_left = lease_end.map(|l| (l - now_ms).max(0));
    let held = f.get(3).and_then(topology::text).as_deref() == Some("1");
    let state = match s.as_str() {
        "i" if held && lease_left == Some(0) => RecordState::Unknown,
        "i" => RecordState::InFlight,
        "c" => RecordState::Completed,
        "r" => RecordState::Released,
        _ => return None,
    };
    Some(Listed {
        store_key: store_key.to_owned(),
        name: listing::name_parts(prefix, store_key),
        state,
        fence: Fence::new(f.get(1).and_then(int).unwrap_or(0) as u64),
        attempts: f.get(4).and_then(int).map_or(0, |a| a as u32),
        claimed_at: f
            .get(5)
            .and_then(int)
            .and_then(|ms| u64::try_from(ms).ok())
            .map(|ms| std::time::UNIX_EPOCH + Duration::from_millis(ms)),
        lease_left: lease_left
            .filter(|_| in_flight)
            .map(|ms| Duration::from_millis(ms as u64)),
    })
}

/// A string record as a listing shows it, from its value and its expiry (a fresh
/// record's fence and claim time derive from the expiry).
fn decode_string(
    store_key: &str,
    prefix: &str,
    value: &Value,
    expires: &Value,
    now_ms: i64,
) -> Option<Listed> {
    let Value::BulkString(b) = value else {
        return None;
    };
    let r = string_record::decode(bytes::Bytes::copy_from_slice(b)).ok()?;
    let times = r.settled_at(int(expires)?.max(0) as u64);
    let now = now_ms.max(0) as u64;
    let in_flight = r.state == string_record::State::InFlight;
    let lease_left = times.lease_end.saturating_sub(now);
    let state = match r.state {
        string_record::State::InFlight if r.hold && lease_left == 0 => RecordState::Unknown,
        string_record::State::InFlight => RecordState::InFlight,
        string_record::State::Completed => RecordState::Completed,
        string_record::State::Released => RecordState::Released,
    };
    Some(Listed {
        store_key: store_key.to_owned(),
        name: listing::name_parts(prefix, store_key),
        state,
        fence: Fence::new(times.fence),
        attempts: r.attempts,
        claimed_at: (times.claimed_at > 0)
            .then(|| std::time::UNIX_EPOCH + Duration::from_millis(times.claimed_at)),
        lease_left: in_flight.then(|| Duration::from_millis(lease_left)),
    })
}

fn wrong_type(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.code() == "WRONGTYPE")
}

/// Where a listing's commands go: the one server, or one master of a cluster.
pub(super) enum Node<'a> {
    Server(&'a RedisStore),
    Master(&'a RedisClusterStore, SingleNodeRoutingInfo),
}

impl Node<'_> {
    async fn send(&self, pipe: redis::Pipeline) -> Result<Vec<Value>, StoreError> {
        match self {
            Node::Server(s) => {
                let pipe = &pipe;
                s.query(move |mut con| async move { pipe.query_async(&mut con).await })
                    .await
            }
            Node::Master(c, at) => c.send_to(pipe, at.clone()).await,
        }
    }

    /// One `SCAN` call: the next cursor (0: done) and the keys.
    async fn scan(&self, cursor: u64, pattern: &str) -> Result<(u64, Vec<String>), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let reply = self.send(pipe).await?;
        let parsed: Option<(u64, Vec<String>)> = reply
            .into_iter()
            .next()
            .and_then(|v| redis::from_redis_value(v).ok());
        parsed.ok_or_else(|| StoreError::Protocol("SCAN: unexpected reply".into()))
    }

    /// The records among `keys`: the server's clock, then each key's fields.
    async fn read(&self, keys: &[String], prefix: &str) -> Result<Vec<Option<Listed>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors().cmd("TIME");
        for key in keys {
            pipe.cmd("HMGET").arg(key).arg(&FIELDS[..]);
        }
        let reply = self.send(pipe).await?;
        let (time, fields) = reply
            .split_first()
            .filter(|(_, f)| f.len() == keys.len())
            .ok_or_else(|| StoreError::Protocol("HMGET pipeline: unexpected reply".into()))?;
        let (secs, micros): (i64, i64) = redis::from_redis_value(time.clone())
            .map_err(|e| StoreError::Protocol(format!("TIME: {e}")))?;
        let now_ms = secs * 1000 + micros / 1000;
        let strings = self.read_strings(keys, fields).await?;
        let mut strings = strings.into_iter();
        Ok(keys
            .iter()
            .zip(fields)
            .map(|(k, f)| match f {
                f if wrong_type(f) => {
                    let (value, expires) = strings.next()?;
                    decode_string(k, prefix, &value, &expires, now_ms)
                }
                Value::ServerError(_) => None,
                f => decode(k, prefix, f, now_ms),
            })
            .collect())
    }

    /// The value and expiry of each key whose `HMGET` met a string, in order.
    async fn read_strings(
        &self,
        keys: &[String],
        fields: &[Value],
    ) -> Result<Vec<(Value, Value)>, StoreError> {
        let strings: Vec<&String> = keys
            .iter()
            .zip(fields)
            .filter(|(_, f)| wrong_type(f))
            .map(|(k, _)| k)
            .collect();
        if strings.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for key in &strings {
            pipe.cmd("GET").arg(*key).cmd("PEXPIRETIME").arg(*key);
        }
        let reply = self.send(pipe).await?;
        if reply.len() != strings.len() * 2 {
            return Err(StoreError::Protocol(
                "GET pipeline: unexpected reply".into(),
            ));
        }
        let mut reply = reply.into_iter();
        Ok(std::iter::from_fn(|| Some((reply.next()?, reply.next()?))).collect())
    }
}

/// Walks `nodes` from the request's cursor until the limit, the scan bound, or the end.
pub(super) async fn walk(nodes: &[Node<'_>], req: &ListRequest) -> Result<Listing, StoreError> {
    let pattern = listing::pattern(&req.prefix, req.route.as_deref());
    let (mut node, mut cursor, mut skip) = match req.cursor {
        Some(Cursor::Scan { node, cursor, skip }) => (node, cursor, skip),
        _ => (0, 0, 0),
    };
    let mut out = Listing::default();
    while let Some(at) = nodes.get(node) {
        if out.records.len() >= req.limit || out.scanned >= MAX_SCANNED {
            out.truncated = true;
            out.cursor = Some(Cursor::Scan { node, cursor, skip });
            return Ok(out);
        }
        let (next, keys) = at.scan(cursor, &pattern).await?;
        let keys = &keys[skip.min(keys.len())..];
        let mut looked = 0;
        for listed in at.read(keys, &req.prefix).await? {
            if out.records.len() >= req.limit {
                break;
            }
            looked += 1;
            out.records
                .extend(listed.filter(|l| req.wanted.admits(l.state)));
        }
        out.scanned += looked;
        if looked < keys.len() {
            // The limit is reached within this batch: go on from its next key.
            skip += looked;
            continue;
        }
        skip = 0;
        (node, cursor) = if next == 0 {
            (node + 1, 0)
        } else {
            (node, next)
        };
    }
    Ok(out)
}

impl RedisStore {
    pub(in crate::store) async fn list(&self, req: &ListRequest) -> Result<Listing, StoreError> {
        walk(&[Node::Server(self)], req).await
    }
}

impl RedisClusterStore {
    pub(in crate::store) async fn list(&self, req: &ListRequest) -> Result<Listing, StoreError> {
        let masters = self.masters().await?;
        let nodes: Vec<Node<'_>> = masters
            .into_iter()
            .map(|at| Node::Master(self, at))
            .collect();
        walk(&nodes, req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(items: &[Option<&str>]) -> Value {
        Value::Array(
            items
                .iter()
                .map(|i| match i {
                    Some(s) => Value::BulkString(s.as_bytes().to_vec()),
                    None => Value::Nil,
                })
                .collect(),
        )
    }

    #[test]
    fn a_holding_claim_past_its_lease_is_held() {
        let key = crate::protocol::key::store_key("dg", "pay", "-", "k1");
        let f = fields(&[
            Some("i"),
            Some("7"),
            Some("1000"),
            Some("1"),
            Some("2"),
            Some("900"),
        ]);
        let held = decode(key.as_str(), "dg", &f, 1500).unwrap();
        assert_eq!(held.state, RecordState::Unknown);
        assert_eq!(held.lease_left, Some(Duration::ZERO));
        assert_eq!((held.fence.get(), held.attempts), (7, 2));
        assert_eq!(held.name.unwrap().key, "k1");
        let live = decode(key.as_str(), "dg", &f, 400).unwrap();
        assert_eq!(live.state, RecordState::InFlight);
        assert_eq!(live.lease_left, Some(Duration::from_millis(600)));
        let f = fields(&[Some("i"), Some("7"), Some("1000"), Some("0"), None, None]);
        assert_eq!(
            decode(key.as_str(), "dg", &f, 1500).unwrap().state,
            RecordState::InFlight
        );
    }

    #[test]
    fn an_entity_record_is_no_record() {
        let f = fields(&[None, None, None, None, None, None]);
        assert_eq!(decode("dg:{x}:pay:-:=entity:e", "dg", &f, 0), None);
    }
}
