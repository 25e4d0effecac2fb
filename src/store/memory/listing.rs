//! Listing the embedded store's records by state: every shard looked at under its own
//! lock, one at a time, the records listed in key order so a cursor (the last key listed)
//! goes on where a page ended.

use super::*;
use crate::store::listing::{self, Cursor, ListRequest, Listed, Listing};

impl MemoryStore {
    pub(in crate::store) async fn list(&self, req: &ListRequest) -> Result<Listing, StoreError> {
        let now = Instant::now();
        let after = match &req.cursor {
            Some(Cursor::After(key)) => Some(key.as_str()),
            _ => None,
        };
        let mut found = Vec::new();
        let mut scanned = 0;
        for shard in &self.inner.shards {
            let shard = Self::lock(shard);
            scanned += shard.records.len();
            for (key, r) in shard.records.iter() {
                if after.is_some_and(|a| key <= a) || !listing::selected(req, key) {
                    continue;
                }
                if let Some(listed) = listed(key, r, now, &req.prefix) {
                    if req.wanted.admits(listed.state) {
                        found.push(listed);
                    }
                }
            }
        }
        found.sort_by(|a, b| a.store_key.cmp(&b.store_key));
        let truncated = found.len() > req.limit;
        found.truncate(req.limit);
        let cursor = truncated
            .then(|| found.last().map(|l| Cursor::After(l.store_key.clone())))
            .flatten();
        Ok(Listing {
            records: found,
            scanned,
            truncated,
            cursor,
        })
    }
}

/// A live record as a listing shows it: its state as [`MemoryStore::inspect`] tells it.
fn listed(key: &str, r: &Record, now: Instant, prefix: &str) -> Option<Listed> {
    if r.expires_at <= now {
        return None;
    }
    let in_flight = r.state == RecordState::InFlight;
    Some(Listed {
        store_key: key.to_owned(),
        name: listing::name_parts(prefix, key),
        state: r.shown_state(now),
        fence: Fence::new(r.fence),
        attempts: r.attempts,
        claimed_at: Some(r.claimed_at),
        lease_left: in_flight.then(|| r.lease_until.saturating_duration_since(now)),
    })
}
