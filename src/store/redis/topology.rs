//! What a Redis Cluster says about its masters, parsed apart from any connection: the
//! masters that own slots (`CLUSTER SLOTS`) and the nodes a master is migrating slots to
//! (its own line in `CLUSTER NODES`). The near-cache's tracking channel subscribes to
//! exactly these (see [`super::tracking`]).

use std::collections::BTreeSet;

use redis::Value;

/// A master as the cluster names it in `CLUSTER SLOTS` (or `CLUSTER NODES`, for a
/// migration's target): its node id and where it is reached.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Node {
    /// The node id (`CLUSTER NODES`, the third field of a `CLUSTER SLOTS` endpoint).
    pub(super) id: String,
    /// Where it is reached.
    pub(super) host: String,
    /// Its port.
    pub(super) port: u16,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A string reply, whichever way it was sent.
pub(super) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => Some(s.clone()),
        _ => None,
    }
}

/// The masters that own slots in a `CLUSTER SLOTS` reply; `asked` stands in for a node
/// named with no endpoint (`""` or `"?"`: the node answering does not know its own).
/// `None` when the reply has another shape.
pub(super) fn masters(reply: &Value, asked: &str) -> Option<BTreeSet<Node>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(parts) = range else {
                return None;
            };
            let Some(Value::Array(master)) = parts.get(2) else {
                return None;
            };
            let host = text(master.first()?)?;
            let Value::Int(port) = master.get(1)? else {
                return None;
            };
            let id = text(master.get(2)?)?;
            let host = if host.is_empty() || host == "?" {
                asked.to_owned()
            } else {
                host
            };
            Some(Node {
                id,
                host,
                port: u16::try_from(*port).ok()?,
            })
        })
        .collect()
}

/// The nodes the answering node is migrating slots to, from its `CLUSTER NODES` reply:
/// the `[slot->-id]` entries of its own (`myself`) line, each found by its id in the same
/// reply. `None` when a target cannot be placed (an unknown id, no address).
pub(super) fn migration_targets(nodes: &str) -> Option<BTreeSet<Node>> {
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .filter(|f| f.len() >= 8)
        .collect();
    let Some(me) = lines
        .iter()
        .find(|f| f[2].split(',').any(|flag| flag == "myself"))
    else {
        return Some(BTreeSet::new());
    };
    me[8..]
        .iter()
        .filter_map(|slot| {
            let (_, id) = slot
                .strip_prefix('[')?
                .strip_suffix(']')?
                .split_once("->-")?;
            Some(id)
        })
        .map(|id| {
            let line = lines.iter().find(|f| f[0] == id)?;
            // `ip:port@bus[,hostname]`; the ip may be IPv6, so the port is after the last ':'.
            let addr = line[1].split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            if host.is_empty() || host == "?" {
                return None;
            }
            Some(Node {
                id: id.to_owned(),
                host: host.to_owned(),
                port: port.parse().ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                bulk(host),
                Value::Int(port),
                bulk(&format!("id{port}")),
                Value::Array(vec![]),
            ]),
            // A replica: not a master.
            Value::Array(vec![bulk("10.0.0.9"), Value::Int(7000), bulk("r")]),
        ])
    }

    fn node(host: &str, port: u16) -> Node {
        Node {
            id: format!("id{port}"),
            host: host.into(),
            port,
        }
    }

    #[test]
    fn masters_are_the_slot_owners_once_each() {
        let reply = Value::Array(vec![
            range(0, 5000, "127.0.0.1", 7001),
            range(5001, 10000, "127.0.0.1", 7002),
            range(10001, 16383, "127.0.0.1", 7001),
            range(16000, 16000, "?", 7003),
        ]);
        let m = masters(&reply, "h").unwrap();
        let want: BTreeSet<Node> = [
            node("127.0.0.1", 7001),
            node("127.0.0.1", 7002),
            node("h", 7003),
        ]
        .into();
        assert_eq!(m, want);
    }

    #[test]
    fn another_shape_is_none() {
        assert_eq!(masters(&bulk("ERR"), "h"), None);
        let short = Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(1)])]);
        assert_eq!(masters(&short, "h"), None);
        assert_eq!(masters(&Value::Array(vec![]), "h"), Some(BTreeSet::new()));
    }

    #[test]
    fn migration_targets_are_the_own_lines_migrating_slots() {
        let nodes = "\
id7002 127.0.0.1:7002@17002 master - 0 1 2 connected 5461-10922
id7001 127.0.0.1:7001@17001,host1 myself,master - 0 0 1 connected 0-5460 [77->-id7004] [78-<-id7002] [79->-id7004]
id7004 127.0.0.1:7004@17004 master - 0 1 0 connected
id7003 ::1:7003@17003 master - 0 1 3 connected 10923-16383 [80->-id7001]
";
        let want: BTreeSet<Node> = [node("127.0.0.1", 7004)].into();
        assert_eq!(migration_targets(nodes), Some(want));
        // Another node's migration is not shown as this one's.
        let other = nodes.replace("myself,master", "master").replace(
            "id7003 ::1:7003@17003 master",
            "id7003 ::1:7003@17003 myself,master",
        );
        assert_eq!(
            migration_targets(&other),
            Some([node("127.0.0.1", 7001)].into())
        );
        let none = "id7001 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-16383\n";
        assert_eq!(migration_targets(none), Some(BTreeSet::new()));
        // A target it cannot place: no proof.
        let unknown = "id7001 127.0.0.1:7001@17001 myself,master - 0 0 1 connected [1->-gone]\n";
        assert_eq!(migration_targets(unknown), None);
    }
}
