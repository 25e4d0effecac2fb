//! Listing records by state, for an operator finding what waits for them
//! (`GET /keys?state=held`, `dedupe-gateway keys list`). Apart from the protocol: a listing
//! only reads, and is no transition of any record.
//!
//! A listing is bounded twice: it stops once it found `limit` records, and once it looked at
//! [`MAX_SCANNED`] keys; either way it says so (`truncated`) and hands back a cursor to go
//! on from. On Redis it walks the keyspace with `SCAN ... MATCH <prefix>:*` (every master of
//! a cluster in turn), so it has `SCAN`'s guarantees: a record present from the first page
//! to the last is listed, one whose state changes meanwhile may be missed or listed twice.

use std::time::{Duration, SystemTime};

use super::{Fence, RecordState};

/// Records a listing returns when the caller names no limit.
pub const DEFAULT_LIMIT: usize = 100;
/// The most records one listing returns.
pub const MAX_LIMIT: usize = 1000;
/// The most keys one listing looks at before it stops (truncated, with a cursor).
pub const MAX_SCANNED: usize = 100_000;
/// `SCAN`'s `COUNT`: keys a node looks at per call.
pub const SCAN_COUNT: usize = 500;

/// The records an operator asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// Unknown outcomes held for a person (`on_unknown = "hold"`, lease over).
    Held,
    /// Claimed, no outcome yet: a live lease, or an expired one awaiting takeover.
    InFlight,
}

impl Wanted {
    /// `held` or `in-flight`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "held" => Some(Self::Held),
            "in-flight" => Some(Self::InFlight),
            _ => None,
        }
    }

    /// The name [`Wanted::parse`] reads.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::InFlight => "in-flight",
        }
    }

    /// Whether a record in `state` is wanted.
    pub fn admits(self, state: RecordState) -> bool {
        match self {
            Self::Held => state == RecordState::Unknown,
            Self::InFlight => state == RecordState::InFlight,
        }
    }
}

/// What to list.
#[derive(Debug, Clone)]
pub struct ListRequest {
    /// Which records.
    pub wanted: Wanted,
    /// `store.prefix`: only keys under it are looked at.
    pub prefix: String,
    /// Only this route's records.
    pub route: Option<String>,
    /// At most this many records (1 to [`MAX_LIMIT`]).
    pub limit: usize,
    /// Where a previous listing stopped.
    pub cursor: Option<Cursor>,
}

/// One record found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The store key.
    pub store_key: String,
    /// Its route, scope hash and key, read back from the store key (see [`name_parts`]).
    pub name: Option<NameParts>,
    /// State.
    pub state: RecordState,
    /// Current fencing token.
    pub fence: Fence,
    /// Claims that won the record.
    pub attempts: u32,
    /// When the current claim won (store clock).
    pub claimed_at: Option<SystemTime>,
    /// Lease time left (zero once it ran out).
    pub lease_left: Option<Duration>,
}

/// A store key read back: `prefix:{tag}:route:scope:key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameParts {
    /// The route.
    pub route: String,
    /// The scope hash, `-` without scope.
    pub scope: String,
    /// The idempotency key or fingerprint.
    pub key: String,
}

/// What a listing found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// The records, at most the limit.
    pub records: Vec<Listed>,
    /// Keys looked at.
    pub scanned: usize,
    /// Stopped at a bound before the whole keyspace was looked at: go on from `cursor`.
    pub truncated: bool,
    /// Where to go on from; `None` once the whole keyspace was looked at.
    pub cursor: Option<Cursor>,
}

/// Where a listing stopped: the node (a cluster's masters in the order of their ids; 0 on
/// one server), the node's `SCAN` cursor, and how many keys of the batch that cursor starts
/// were already looked at. In memory, the last store key listed. Spelled `node.cursor.skip`
/// or `=key` to the caller, who hands it back unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    /// A Redis walk.
    Scan {
        /// Index of the node.
        node: usize,
        /// Its `SCAN` cursor.
        cursor: u64,
        /// Keys of that cursor's batch already looked at.
        skip: usize,
    },
    /// The memory store: listed in key order, on after this key.
    After(String),
}

impl Cursor {
    /// Reads what [`Cursor`]'s `Display` wrote.
    pub fn parse(s: &str) -> Option<Self> {
        if let Some(key) = s.strip_prefix('=') {
            return Some(Self::After(key.to_owned()));
        }
        let mut parts = s.split('.');
        let cursor = Self::Scan {
            node: parts.next()?.parse().ok()?,
            cursor: parts.next()?.parse().ok()?,
            skip: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(cursor)
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Scan { node, cursor, skip } => write!(f, "{node}.{cursor}.{skip}"),
            Self::After(key) => write!(f, "={key}"),
        }
    }
}

/// The `SCAN` pattern of a listing: the prefix's records, or one route's.
pub fn pattern(prefix: &str, route: Option<&str>) -> String {
    let mut p = glob_escaped(prefix);
    p.push_str(":{*}:");
    if let Some(route) = route {
        p.push_str(&glob_escaped(route));
        p.push(':');
    }
    p.push('*');
    p
}

/// Whether `store_key` is one of the listing's records by its name (the memory store's
/// filter; Redis's `MATCH` is the same test).
pub fn selected(req: &ListRequest, store_key: &str) -> bool {
    name_parts(&req.prefix, store_key)
        .is_some_and(|n| req.route.as_deref().is_none_or(|r| r == n.route))
}

fn glob_escaped(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A record's store key read back into its route, scope and key (see
/// [`crate::protocol::key::store_key`]); `None` for a key of another spelling (an entity's order
/// record, `...:=entity:<hash>`, or anything else under the prefix).
pub fn name_parts(prefix: &str, store_key: &str) -> Option<NameParts> {
    let rest = store_key.strip_prefix(prefix)?.strip_prefix(":{")?;
    let (_tag, rest) = rest.split_once("}:")?;
    let (route, rest) = rest.split_once(':')?;
    let (scope, key) = rest.split_once(':')?;
    if key.starts_with("=entity:") || route.is_empty() || key.is_empty() {
        return None;
    }
    Some(NameParts {
        route: route.to_owned(),
        scope: scope.to_owned(),
        key: key.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_key_reads_back_into_its_parts() {
        let k = crate::protocol::key::store_key("dg", "pay", "-", "a:b:c");
        let n = name_parts("dg", k.as_str()).unwrap();
        assert_eq!((&*n.route, &*n.scope, &*n.key), ("pay", "-", "a:b:c"));
        let entity = crate::protocol::key::order::entity_key("dg", "pay", "-", "abc");
        assert_eq!(name_parts("dg", entity.as_str()), None);
        assert_eq!(name_parts("other", k.as_str()), None);
    }

    #[test]
    fn the_pattern_matches_its_prefix_and_route_only() {
        assert_eq!(pattern("dg", None), "dg:{*}:*");
        assert_eq!(pattern("d*g", Some("pay")), "d\\*g:{*}:pay:*");
    }

    #[test]
    fn cursors_read_back() {
        for c in [
            Cursor::Scan {
                node: 2,
                cursor: 1234,
                skip: 7,
            },
            Cursor::After("dg:{x}:pay:-:k.1".into()),
        ] {
            assert_eq!(Cursor::parse(&c.to_string()), Some(c));
        }
        assert_eq!(Cursor::parse("1.2"), None);
        assert_eq!(Cursor::parse("a.b.c"), None);
    }
}
