//! What a route makes of one request: its key, scope, request hash, order and store keys,
//! and from them the one verdict (claim, forward without dedupe, or refuse). Pure.
//!
//! The request pipeline, `check --request`, the drill's request generator and the admin
//! API all come here, so what `check --request` predicts is what the gateway does.

use std::borrow::Cow;

use http::HeaderMap;

use super::{Mode, Route};
use crate::protocol::key::coding;
use crate::protocol::key::order::{self, Ordered};
use crate::protocol::key::{self, KeyError, KeyRule, MatchRule, RequestPart, RequestView};
use crate::protocol::tokens::{RequestHash, StoreKey};

/// How the store names records: what the derivation needs of `[store]`.
#[derive(Debug, Clone, Copy)]
pub struct Namespace<'a> {
    /// `store.prefix`.
    pub prefix: &'a str,
    /// Whether an ordered route's records carry their entity's hash tag (a Redis Cluster:
    /// a record and its entity's order record must share a slot).
    pub tags_by_entity: bool,
}

impl Namespace<'_> {
    /// The store key of a record, as an operator names it: the route, the scope hash, the
    /// key and, where records carry it, the entity's hash.
    pub fn record_key(
        &self,
        route: &str,
        scope: &str,
        key: &str,
        entity: Option<&str>,
    ) -> StoreKey {
        let entity = entity.filter(|_| self.tags_by_entity);
        order::record_key(self.prefix, route, scope, key, entity)
    }
}

/// What a request is under its route's rules, before the store is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    /// The idempotency key: the header's value, or the fingerprint.
    pub key: String,
    /// The scope hash (`-` on a route without scope).
    pub scope: String,
    /// What makes "the same request" under the route's `match`.
    pub request_hash: RequestHash,
    /// On an ordered route: the entity written and its version.
    pub ordered: Option<Ordered>,
}

impl Derived {
    /// The record's store key under `ns` on the route named `route`.
    pub fn record_key(&self, ns: Namespace<'_>, route: &str) -> StoreKey {
        let entity = self.ordered.as_ref().map(|o| o.entity.as_str());
        ns.record_key(route, &self.scope, &self.key, entity)
    }
}

/// A record as an operator names it (see [`Route::record_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The idempotency key.
    pub key: String,
    /// The scope hash.
    pub scope: String,
    /// On an ordered route: the entity's hash.
    pub entity: Option<String>,
    /// The record's store key.
    pub store_key: StoreKey,
}

/// A request the store will be asked to claim: everything it is keyed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyed {
    /// The idempotency key.
    pub key: String,
    /// The scope hash.
    pub scope: String,
    /// The request hash.
    pub request_hash: RequestHash,
    /// The record's store key.
    pub store_key: StoreKey,
    /// On an ordered route: the entity's order record, and this request's place in it.
    pub order: Option<(StoreKey, Ordered)>,
}

/// What the gateway does with a request on a route that dedupes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Claim it in the store (on a shadow route too: claimed, recorded, then forwarded).
    Claim(Keyed),
    /// No claim: forwarded without dedupe, or refused.
    Skip(Skip),
}

/// Why a request on a deduping route makes no claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// Forward it without dedupe: an optional key header is absent.
    NoKey,
    /// Its key, scope, `match` or order parts are missing or unusable: a 400 on an
    /// enforcing route; forwarded, with that 400 counted as enforcement's answer, on a
    /// shadow route.
    Refused {
        /// Why.
        error: KeyError,
        /// The route is in shadow mode: forwarded all the same.
        forwarded: bool,
    },
}

impl Route {
    /// The verdict the headers alone decide, before any body is read: a header key that is
    /// absent or unusable. `None` when the body is needed (every other case, and every
    /// request on a signed route, which trusts nothing of a request before its signature
    /// over the body verifies).
    pub fn verdict_from_headers(&self, headers: &HeaderMap) -> Option<Skip> {
        self.header_key(headers).err()
    }

    /// As [`Route::verdict_from_headers`], with the header key it read when the request
    /// goes on (`Ok(None)`: the body decides), for [`Route::verdict_with`] to take rather
    /// than read it again.
    pub fn header_key(&self, headers: &HeaderMap) -> Result<Option<String>, Skip> {
        let KeyRule::Header { .. } = self.key else {
            return Ok(None);
        };
        if self.verify.is_some() {
            return Ok(None);
        }
        let view = RequestView {
            method: &http::Method::POST,
            path: "",
            query: None,
            headers,
            body: &[],
        };
        match self.key.derive(&view) {
            Ok(Some(key)) => Ok(Some(key)),
            Ok(None) => Err(Skip::NoKey),
            Err(error) => Err(self.refuse(error)),
        }
    }

    /// The verdict on a whole request (its path normalised, its body read, at most
    /// `max_body` bytes once its content coding is undone).
    pub fn verdict(&self, ns: Namespace<'_>, max_body: u64, req: &RequestView<'_>) -> Verdict {
        self.verdict_with(ns, max_body, req, None)
    }

    /// [`Route::verdict`], with the header key [`Route::header_key`] read from the same
    /// headers, when it read one (the key is the headers', whatever the body).
    pub fn verdict_with(
        &self,
        ns: Namespace<'_>,
        max_body: u64,
        req: &RequestView<'_>,
        header_key: Option<String>,
    ) -> Verdict {
        let body = match self.content(req, max_body) {
            Ok(body) => body,
            Err(error) => return Verdict::Skip(self.refuse(error)),
        };
        let req = RequestView {
            body: &body,
            ..*req
        };
        match self.derive_with(&req, header_key) {
            Ok(Some(derived)) => Verdict::Claim(self.keyed(ns, derived)),
            Ok(None) => Verdict::Skip(Skip::NoKey),
            Err(error) => Verdict::Skip(self.refuse(error)),
        }
    }

    /// The body as this route keys it: its content coding undone when any rule reads the
    /// body (the same content compressed twice is one request); as sent otherwise. On a
    /// `grpc = true` route, the one message, its `grpc-encoding` undone.
    fn content<'b>(&self, req: &RequestView<'b>, max_body: u64) -> Result<Cow<'b, [u8]>, KeyError> {
        if self.grpc {
            let message = crate::protocol::grpc::frame::single(req.body)?;
            if !message.compressed {
                return Ok(Cow::Borrowed(message.payload));
            }
            let encoding = &crate::protocol::grpc::GRPC_ENCODING;
            return Ok(coding::decoded_by(
                encoding,
                req.headers,
                message.payload,
                max_body,
            )?);
        }
        if self.reads_body() {
            Ok(coding::decoded(req.headers, req.body, max_body)?)
        } else {
            Ok(Cow::Borrowed(req.body))
        }
    }

    /// Whether keying this request undoes a coding: a compressed gRPC message, or a
    /// `Content-Encoding` on a route whose rules read the body (see [`Route::verdict`]).
    pub fn decodes(&self, headers: &HeaderMap) -> bool {
        if self.grpc {
            return coding::is_coded(&crate::protocol::grpc::GRPC_ENCODING, headers);
        }
        self.reads_body() && coding::is_coded(&http::header::CONTENT_ENCODING, headers)
    }

    /// Whether the key, scope, `match` or order read the body.
    pub fn reads_body(&self) -> bool {
        let body = |p: &RequestPart| matches!(p, RequestPart::Body | RequestPart::Json(_));
        let key = match &self.key {
            KeyRule::Header { .. } => false,
            KeyRule::Fingerprint(parts) => parts.iter().any(body),
        };
        let must_match = match &self.must_match {
            MatchRule::Request => true,
            MatchRule::Parts(parts) => parts.iter().any(body),
        };
        let order = self
            .order
            .as_ref()
            .is_some_and(|o| body(&o.entity) || body(&o.version));
        key || must_match || order || self.scope.iter().any(body)
    }

    /// Key, scope, request hash and order of a request; `Ok(None)` when an optional key
    /// header is absent.
    pub fn derive(&self, req: &RequestView<'_>) -> Result<Option<Derived>, KeyError> {
        self.derive_with(req, None)
    }

    /// [`Route::derive`], the key already read when `known`.
    fn derive_with(
        &self,
        req: &RequestView<'_>,
        known: Option<String>,
    ) -> Result<Option<Derived>, KeyError> {
        let Some((key, scope)) = self.key_and_scope(req, known)? else {
            return Ok(None);
        };
        Ok(Some(Derived {
            key,
            scope,
            request_hash: key::request_hash(req, &self.must_match, &self.hash_headers)?,
            ordered: self.ordered(req)?,
        }))
    }

    /// The key and scope hash of a request (both steps of [`Route::derive`] and
    /// [`Route::record_of`]); `Ok(None)` when an optional key header is absent.
    fn key_and_scope(
        &self,
        req: &RequestView<'_>,
        known: Option<String>,
    ) -> Result<Option<(String, String)>, KeyError> {
        let key = match known {
            Some(key) => key,
            None => match self.key.derive(req)? {
                Some(key) => key,
                None => return Ok(None),
            },
        };
        Ok(Some((key, key::scope_hash(&self.scope, req)?)))
    }

    /// On an ordered route, the entity and version of a request.
    fn ordered(&self, req: &RequestView<'_>) -> Result<Option<Ordered>, KeyError> {
        self.order.as_ref().map(|o| o.derive(req)).transpose()
    }

    /// What names a request's record, for an operator (`dedupe-gateway keys`): the key,
    /// scope and entity as [`Route::derive`] makes them (the body's content coding undone
    /// as [`Route::verdict`] does) and the store key; not the request hash, so naming a
    /// record takes no more of the request than its key, scope and order read.
    /// `Ok(None)`: an optional key header is absent.
    pub fn record_of(
        &self,
        ns: Namespace<'_>,
        max_body: u64,
        req: &RequestView<'_>,
    ) -> Result<Option<Named>, KeyError> {
        let body = self.content(req, max_body)?;
        let req = RequestView {
            body: &body,
            ..*req
        };
        let Some((key, scope)) = self.key_and_scope(&req, None)? else {
            return Ok(None);
        };
        let entity = self.ordered(&req)?.map(|o| o.entity);
        let store_key = ns.record_key(&self.name, &scope, &key, entity.as_deref());
        Ok(Some(Named {
            key,
            scope,
            entity,
            store_key,
        }))
    }

    /// A derived request with its store keys under `ns`.
    fn keyed(&self, ns: Namespace<'_>, derived: Derived) -> Keyed {
        let store_key = derived.record_key(ns, &self.name);
        let Derived {
            key,
            scope,
            request_hash,
            ordered,
        } = derived;
        let order = ordered.map(|o| {
            let entity = order::entity_key(ns.prefix, &self.name, &scope, &o.entity);
            (entity, o)
        });
        Keyed {
            key,
            scope,
            request_hash,
            store_key,
            order,
        }
    }

    pub(crate) fn refuse(&self, error: KeyError) -> Skip {
        Skip::Refused {
            error,
            forwarded: self.mode == Mode::Shadow,
        }
    }
}
