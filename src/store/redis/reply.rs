//! The scripts' replies, parsed apart from the I/O.

use bytes::Bytes;
use redis::Value;
use std::time::Duration;

use super::{int, protocol};
use crate::store::health::NodeReplies;
use crate::store::{Claim, Permit, RecordInfo, RecordState, StoreError, StoreKey};

/// How long the record a replay reply carries has left (its `PTTL` as the claim saw it).
pub(super) fn replay_ttl(v: &Value) -> Option<Duration> {
    let Value::Array(items) = v else { return None };
    if items.first().and_then(int) != Some(2) {
        return None;
    }
    let ms = items.get(2).and_then(int)?;
    (ms > 0).then(|| Duration::from_millis(ms as u64))
}

pub(super) fn parse_claim(v: Value, key: &StoreKey) -> Result<Claim, StoreError> {
    let Value::Array(mut items) = v else {
        return Err(protocol("claim", &v));
    };
    let code = items.first().and_then(int);
    let bad = |items: &[Value]| protocol("claim", &Value::Array(items.to_vec()));
    let fence_at = |i: usize| {
        items
            .get(i)
            .and_then(int)
            .map(|f| crate::store::Fence::new(f as u64))
            .ok_or_else(|| bad(&items))
    };
    match code {
        Some(1) => Ok(Claim::Won {
            permit: Permit::new(key, fence_at(1)?),
            takeover: None,
        }),
        Some(5) => Ok(Claim::Won {
            permit: Permit::new(key, fence_at(1)?),
            takeover: Some(fence_at(2)?),
        }),
        Some(6) => Ok(Claim::Held {
            fence: fence_at(1)?,
            first: items.get(2).and_then(int) == Some(1),
        }),
        // Take the record out of the reply rather than copy it: it can be large.
        Some(2) if matches!(items.get(1), Some(Value::BulkString(_))) => {
            match items.swap_remove(1) {
                Value::BulkString(b) => Ok(Claim::Replay(Bytes::from(b))),
                other => Err(protocol("claim record", &other)),
            }
        }
        Some(3) => Ok(Claim::Conflict {
            retry_after: Duration::from_millis(
                items
                    .get(1)
                    .and_then(int)
                    .ok_or_else(|| bad(&items))?
                    .max(0) as u64,
            ),
        }),
        Some(4) => Ok(Claim::Mismatch),
        Some(7) => Ok(Claim::Stale),
        _ => Err(bad(&items)),
    }
}

pub(super) fn parse_finish(v: Value) -> Result<bool, StoreError> {
    match int(&v) {
        Some(1) => Ok(true),
        Some(0) => Ok(false),
        _ => Err(protocol("finish", &v)),
    }
}

pub(super) fn parse_renew(v: Value) -> Result<bool, StoreError> {
    match int(&v) {
        Some(1) => Ok(true),
        Some(0) => Ok(false),
        _ => Err(protocol("renew", &v)),
    }
}

pub(super) fn parse_inspect(v: Value) -> Result<Option<RecordInfo>, StoreError> {
    let items = match &v {
        Value::Int(0) => return Ok(None),
        Value::Array(items) if items.len() == 10 => items,
        _ => return Err(protocol("inspect", &v)),
    };
    let state = match &items[0] {
        Value::BulkString(s) if s == b"i" => RecordState::InFlight,
        Value::BulkString(s) if s == b"c" => RecordState::Completed,
        Value::BulkString(s) if s == b"r" => RecordState::Released,
        Value::BulkString(s) if s == b"u" => RecordState::Unknown,
        _ => return Err(protocol("inspect state", &v)),
    };
    let fence = int(&items[1]).ok_or_else(|| protocol("inspect fence", &v))? as u64;
    let left = int(&items[2]).ok_or_else(|| protocol("inspect lease", &v))?;
    let pttl = int(&items[3]).ok_or_else(|| protocol("inspect ttl", &v))?;
    let response = match &items[4] {
        Value::BulkString(b) if !b.is_empty() => Some(Bytes::from(b.clone())),
        _ => None,
    };
    let at = |i: usize, what: &str| {
        let ms = int(&items[i]).ok_or_else(|| protocol(what, &v))?;
        Ok::<_, StoreError>(
            u64::try_from(ms)
                .ok()
                .map(|ms| std::time::UNIX_EPOCH + Duration::from_millis(ms)),
        )
    };
    let attempts = int(&items[6]).ok_or_else(|| protocol("inspect attempts", &v))?;
    Ok(Some(RecordInfo {
        state,
        fence: crate::store::Fence::new(fence),
        held: matches!(&items[5], Value::BulkString(b) if b == b"1"),
        lease_left: (left >= 0).then(|| Duration::from_millis(left as u64)),
        expires_in: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
        response,
        attempts: u32::try_from(attempts).unwrap_or(0),
        claimed_at: at(7, "inspect claimed at")?,
        completed_at: at(8, "inspect completed at")?,
        version: match &items[9] {
            Value::BulkString(b) if !b.is_empty() => Some(Bytes::from(b.clone())),
            _ => None,
        },
    }))
}

/// `CONFIG GET name` as one value; `None` when the node refuses it.
fn config_value(v: Value, name: &str) -> Option<String> {
    let map: std::collections::HashMap<String, String> = redis::from_redis_value(v).ok()?;
    map.get(name).cloned()
}

/// The commands a store check sends to each node.
pub(super) const CONFIG_CHECKED: [&str; 4] = [
    "maxmemory-policy",
    "appendonly",
    "save",
    // Both names on Redis 7 (`listpack`, and `ziplist` as its alias); Redis 6 has `ziplist`.
    "hash-max-*-value",
];

pub(super) fn node_replies(
    node: String,
    config: [Option<Value>; 4],
    [replication, server]: [Option<Value>; 2],
) -> NodeReplies {
    let [policy, aof, save, listpack] = config;
    let get = |v: Option<Value>, name| v.and_then(|v| config_value(v, name));
    NodeReplies {
        node,
        maxmemory_policy: get(policy, CONFIG_CHECKED[0]),
        appendonly: get(aof, CONFIG_CHECKED[1]),
        save: get(save, CONFIG_CHECKED[2]),
        hash_max_listpack_value: listpack.and_then(|v| {
            config_value(v.clone(), "hash-max-listpack-value")
                .or_else(|| config_value(v, "hash-max-ziplist-value"))
        }),
        replication: replication.and_then(|v| redis::from_redis_value(v).ok()),
        server: server.and_then(|v| redis::from_redis_value(v).ok()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_reply(pairs: &[(&str, &str)]) -> Option<Value> {
        Some(Value::Array(
            pairs
                .iter()
                .flat_map(|(k, v)| [k, v])
                .map(|s| Value::BulkString(s.as_bytes().to_vec()))
                .collect(),
        ))
    }

    #[test]
    fn the_listpack_value_is_read_under_either_name() {
        let replies =
            |listpack| node_replies("n:1".into(), [None, None, None, listpack], [None, None]);
        // Redis 7: both names, the listpack one first.
        let r7 = config_reply(&[
            ("hash-max-listpack-value", "1024"),
            ("hash-max-ziplist-value", "1024"),
        ]);
        assert_eq!(replies(r7).hash_max_listpack_value.as_deref(), Some("1024"));
        // Redis 6: only the ziplist name.
        let r6 = config_reply(&[("hash-max-ziplist-value", "64")]);
        assert_eq!(replies(r6).hash_max_listpack_value.as_deref(), Some("64"));
        // Refused, or nothing matched.
        assert_eq!(replies(None).hash_max_listpack_value, None);
        assert_eq!(replies(config_reply(&[])).hash_max_listpack_value, None);
    }
}
