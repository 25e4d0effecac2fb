//! What became of a request and of its claim: the labels of every request metric and the
//! `outcome` / `finish` fields of every access-log line. The names are derived from the
//! variants (snake case), never written out by hand.

/// What the gateway did with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Outcome {
    /// Claimed the key and forwarded.
    Won,
    /// Took over an expired lease and forwarded.
    Takeover,
    /// Answered from the stored response.
    Replayed,
    /// Joined the first request's answer as it streamed on this gateway
    /// (`on_conflict = "join"`): one upstream call, its bytes relayed.
    Joined,
    /// 409: in flight elsewhere.
    Conflict,
    /// 422: same key, different request.
    Mismatch,
    /// 409: an earlier claim's outcome is unknown and held for an operator.
    Held,
    /// 200 `Dedupe-Stale: true`: an ordered route's request whose version is not greater
    /// than the highest completed for its entity; never forwarded.
    Stale,
    /// The store failed; the route failed closed (503).
    StoreError,
    /// The store failed; the route failed open and forwarded without dedupe.
    FailOpen,
    /// A required key was absent.
    MissingKey,
    /// The key header or fingerprint input was unusable.
    InvalidKey,
    /// Matched a route but carried no optional key: forwarded without dedupe.
    NoKey,
    /// Matched no route: proxied untouched.
    Passthrough,
    /// Refused before any key was looked at (framing, size, a broken body).
    Rejected,
    /// A shadow route forwarded a request that `enforce` would have answered otherwise
    /// (what it would have done is the request's [`Would`]).
    Shadowed,
}

impl Outcome {
    /// The label text.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What became of a won claim once its upstream call ended (the log's `finish`). Counted
/// in addition to the request's `won` or `takeover`, except `completed`, the normal end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Finish {
    /// The response is stored; duplicates replay it.
    Completed,
    /// The upstream did not act (connect failure, 5xx): the key is free for a retry.
    Released,
    /// The key was taken over under a newer fence meanwhile: nothing was written.
    FencedOut,
    /// The upstream may have acted but did not answer: the claim is kept until its lease
    /// ends.
    OutcomeUnknown,
    /// The upstream answered but the store failed to complete or release the claim.
    Unstored,
}

impl Finish {
    /// The label text.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What `mode = "enforce"` would have done with a request a shadow route forwarded: the
/// `would` label of `dedupe_shadow_total` and the access log's `would` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Would {
    /// Answered from the stored response.
    Replay,
    /// 409: another request with the key is in flight (or, with `on_conflict = "wait"`,
    /// held until it could be replayed).
    Conflict,
    /// 422: the key was used for a different request.
    Mismatch,
    /// 409 `outcome-unknown`: an earlier claim's outcome is held for an operator.
    Held,
    /// 200 `Dedupe-Stale: true`: a newer version of the entity was already completed.
    Stale,
    /// 503: the store failed on a fail-closed route.
    StoreError,
    /// 400: the required key was absent.
    MissingKey,
    /// 400: the key, a fingerprint part, a scope or `match` part was unusable.
    InvalidKey,
}

impl Would {
    /// The label text.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strum::VariantArray;

    #[test]
    fn names_are_snake_case_and_distinct() {
        let mut names: Vec<&str> = Outcome::VARIANTS.iter().map(|o| o.as_str()).collect();
        names.extend(Finish::VARIANTS.iter().map(|f| f.as_str()));
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "an outcome and a finish share a name");
        assert_eq!(Outcome::StoreError.as_str(), "store_error");
        assert_eq!(Finish::OutcomeUnknown.as_str(), "outcome_unknown");
        assert!(names
            .iter()
            .all(|n| n.chars().all(|c| c.is_ascii_lowercase() || c == '_')));
    }
}
