//! The operations, the same on both backends (`redis_backend!`): each builds its command
//! once and hands `query` a closure that sends it on a connection (possibly twice, see
//! [`super::RedisStore::query`]); replies are parsed apart from the I/O.
//!
//! A record's layout follows its route: a plain route's record is a string (see
//! [`super::string_record`]), an ordered route's a hash (see [`super::scripts`]: its
//! scripts take the entity's record in the same atomic step). A request's operation knows
//! which from its [`Order`](crate::store::Order); a key that holds anything else (the other layout, a value
//! no gateway wrote) is [`StoreError::Unreadable`](crate::store::StoreError::Unreadable), never read as absent and never
//! written over. An operator's inspect and resolve name a key of either kind of route and
//! ask its `TYPE` first.

macro_rules! redis_backend {
    ($name:ident) => {
        impl $name {
            /// Per-operation deadline.
            pub fn timeout(&self) -> Duration {
                self.timeout
            }

            fn near_cache(&self) -> Option<&NearCache> {
                self.near.as_deref()
            }

            /// The near-cache's counters, when it has one.
            pub fn near_cache_stats(&self) -> Option<NearCacheStats> {
                self.near
                    .as_ref()
                    .map(|n| n.stats(std::time::Instant::now()))
            }

            pub(in crate::store) async fn claim(
                &self,
                req: ClaimRequest<'_>,
            ) -> Result<Claim, StoreError> {
                let near = self.near_cache();
                let key = req.key.as_str();
                if let Some(near) = near {
                    if let Some(record) = near.get(key, req.request_hash, std::time::Instant::now())
                    {
                        return Ok(Claim::Replay(record));
                    }
                }
                // Before sending: the expiry counts from here, and an invalidation that
                // overtakes the reply refuses the copy.
                let mark = near.map(|near| (near.mark(), std::time::Instant::now()));
                let (claim, ttl) = if req.order.is_some() {
                    self.claim_hash(req).await?
                } else {
                    self.claim_string(req).await?
                };
                if let (Some(near), Some((mark, sent)), Some(ttl), Claim::Replay(record)) =
                    (near, mark, ttl, &claim)
                {
                    near.insert(key, *req.request_hash, record.clone(), sent + ttl, mark);
                }
                Ok(claim)
            }

            /// An ordered route's claim: the hash layout's script.
            async fn claim_hash(
                &self,
                req: ClaimRequest<'_>,
            ) -> Result<(Claim, Option<Duration>), StoreError> {
                let v = self.call(&claim_invocation(&self.scripts, req)).await?;
                let ttl = replay_ttl(&v);
                Ok((parse_claim(v, req.key)?, ttl))
            }

            /// One `MULTI` of native commands (two when another claim's record is in
            /// flight: the second reads the server's time); the claim script only for a
            /// takeover, a reclaim, or the first claim told a record is held.
            async fn claim_string(
                &self,
                req: ClaimRequest<'_>,
            ) -> Result<(Claim, Option<Duration>), StoreError> {
                let mut with_time = self.near.is_some();
                let value = &strings::claim_value(req);
                loop {
                    let pipe = &strings::claim_transaction(req, value, with_time);
                    let v = self
                        .query(move |mut con| async move {
                            strings::send(pipe, &mut con).await.map(Some).or_else(strings::discarded)
                        })
                        .await?;
                    // A transaction Redis discarded ran nothing: the script decides.
                    let Some(v) = v else { break };
                    match strings::parse_native_claim(v, req, value)? {
                        strings::Native::Decided(claim, ttl) => return Ok((claim, ttl)),
                        strings::Native::Recheck if !with_time => with_time = true,
                        strings::Native::Recheck | strings::Native::Script => break,
                    }
                }
                let v = self
                    .call(&strings::claim_invocation(&self.scripts.string, req))
                    .await?;
                let ttl = replay_ttl(&v);
                Ok((parse_claim(v, req.key)?, ttl))
            }

            /// Drops this gateway's copy of `key` as it changes it: its own writes bring
            /// no invalidation (`NOLOOP`). (Completing and releasing change in-flight
            /// records, never copied; dropped anyway, it costs nothing.)
            fn changing(&self, key: &str) {
                if let Some(near) = self.near_cache() {
                    near.invalidate(key);
                }
            }

            /// Sends a script call.
            async fn call(&self, inv: &Call<'_>) -> Result<Value, StoreError> {
                self.call_lane(Lane::Claims, inv).await
            }

            /// Sends a script call on the connection of `lane`.
            async fn call_lane(&self, lane: Lane, inv: &Call<'_>) -> Result<Value, StoreError> {
                self.query_lane(lane, move |mut con| async move { inv.invoke(&mut con).await })
                    .await
            }

            /// Whether `key` holds an ordered route's record (a hash), for an operator's
            /// action, which names a key of either kind of route.
            async fn holds_hash(&self, key: &str) -> Result<bool, StoreError> {
                let cmd = &redis::cmd("TYPE").arg(key).clone();
                let kind: String = self
                    .query(move |mut con| async move { cmd.query_async(&mut con).await })
                    .await?;
                Ok(kind == "hash")
            }

            pub(in crate::store) async fn complete(
                &self,
                key: &str,
                owner: Owner<'_>,
                record: Bytes,
                window: Duration,
                strict: bool,
                order: Option<Order<'_>>,
            ) -> Result<bool, StoreError> {
                self.finish(key, owner, Some(&record), window, strict, order)
                    .await
            }

            pub(in crate::store) async fn release(
                &self,
                key: &str,
                owner: Owner<'_>,
                window: Duration,
                strict: bool,
                order: Option<Order<'_>>,
            ) -> Result<bool, StoreError> {
                self.finish(key, owner, None, window, strict, order).await
            }

            async fn finish(
                &self,
                key: &str,
                owner: Owner<'_>,
                record: Option<&[u8]>,
                window: Duration,
                strict: bool,
                order: Option<Order<'_>>,
            ) -> Result<bool, StoreError> {
                self.changing(key);
                // An operator's resolution (strict) may name an ordered route's record.
                let v = if order.is_some() || (strict && self.holds_hash(key).await?) {
                    let inv = finish_invocation(&self.scripts, key, owner.fence, record, window, strict, order);
                    self.call_lane(Lane::Leases, &inv).await?
                } else {
                    self.finish_string(key, owner, record, window, strict).await?
                };
                parse_finish(v)
            }

            /// A plain route's finish, on the leases' connection (see [`super::links::Lane`]).
            /// A completion of the claim's own fresh record goes
            /// in the form the connection's strategy chooses (see [`super::completion`]),
            /// and in the next where the server turns out to lack it; any other finish is
            /// the script's full form.
            async fn finish_string(
                &self,
                key: &str,
                owner: Owner<'_>,
                record: Option<&[u8]>,
                window: Duration,
                strict: bool,
            ) -> Result<Value, StoreError> {
                let strategy = self.completion();
                let mut fresh = strings::fresh_completion(owner, record, window, strict);
                let finish = &self.scripts.string.finish;
                let staged = fresh.and_then(|(header, response, claimed)| {
                    staged::staged_completion(finish, key, claimed, header, response, window)
                });
                if let Some((_, response, claimed)) = fresh {
                    let native = compare::completion(key, claimed, owner.fence, response, window)
                        .filter(|_| strategy.form(staged.is_some()) == Form::Native);
                    if let Some(cmd) = &native {
                        let compared = self
                            .query_lane(Lane::Leases, move |mut con| async move { compare::send(cmd, strategy, &mut con).await })
                            .await?;
                        match compared {
                            compare::Compared::Written => return Ok(Value::Int(1)),
                            // The key no longer holds the claim's value: the compare form's
                            // own comparison with it would miss too.
                            compare::Compared::Differs => fresh = None,
                            compare::Compared::NotNative => {}
                        }
                    }
                }
                let unstaged = || {
                    let scripts = &self.scripts.string;
                    strings::finish_call(scripts, key, owner, record, window, strict, fresh)
                };
                let staged = staged.filter(|_| fresh.is_some() && strategy.form(true) == Form::Staged);
                if let Some(staged) = &staged {
                    let unstaged = &unstaged;
                    return self
                        .query_lane(Lane::Leases, move |mut con| async move {
                            staged.send_or(strategy, &mut con, unstaged).await
                        })
                        .await;
                }
                self.call_lane(Lane::Leases, &unstaged()).await
            }

            pub(in crate::store) async fn renew(
                &self,
                key: &str,
                Owner { fence, claimant, .. }: Owner<'_>,
                lease: Duration,
                order: Option<Order<'_>>,
            ) -> Result<bool, StoreError> {
                let inv = match order {
                    Some(_) => renew_invocation(&self.scripts, key, fence, lease, order),
                    None => strings::renew_invocation(&self.scripts.string, key, fence, claimant, lease),
                };
                parse_renew(self.call_lane(Lane::Leases, &inv).await?)
            }

            pub(in crate::store) async fn inspect(
                &self,
                key: &str,
            ) -> Result<Option<RecordInfo>, StoreError> {
                if self.holds_hash(key).await? {
                    return parse_inspect(self.call(&self.scripts.inspect.key(key)).await?);
                }
                self.inspect_string(key).await
            }

            async fn inspect_string(
                &self,
                key: &str,
            ) -> Result<Option<RecordInfo>, StoreError> {
                let pipe = &strings::inspect_pipeline(key);
                let v = self
                    .query(move |mut con| async move {
                        strings::send(pipe, &mut con).await.map(Some).or_else(strings::discarded)
                    })
                    .await?;
                let v = match v {
                    Some(v) => v,
                    // Discarded: the same reads as one script.
                    None => self.call(&self.scripts.string.inspect.key(key)).await?,
                };
                strings::parse_inspect(v)
            }

            pub(in crate::store) async fn forget(&self, key: &str) -> Result<bool, StoreError> {
                self.changing(key);
                let inv = self.scripts.string.forget.key(key);
                let mut n = Ok(-1);
                // A record is not deleted within the millisecond its fence names (see
                // the script): a few tries a millisecond apart at most.
                for attempt in 0..$crate::store::redis::ops::FORGET_TRIES {
                    if attempt > 0 {
                        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    }
                    n = self
                        .call(&inv)
                        .await
                        .and_then(|v| int(&v).ok_or_else(|| protocol("forget", &v)));
                    if !matches!(n, Ok(-1)) {
                        break;
                    }
                }
                // Again once the delete has run (or may have): a claim of this gateway
                // that read the record before the delete must not keep its copy.
                self.changing(key);
                match n? {
                    -1 => Err(StoreError::Unavailable("Redis's clock is not yet past the millisecond of the record's fence: the record was not deleted; try again".into())),
                    n => Ok(n > 0),
                }
            }

            /// A `PING` on every connection the store keeps.
            pub(in crate::store) async fn ping(&self) -> Result<(), StoreError> {
                let cmd = &redis::cmd("PING");
                let _: Vec<String> = self
                    .query_each(move |mut con| async move { cmd.query_async(&mut con).await })
                    .await?;
                Ok(())
            }
        }
    };
}

/// How many times a forget asks (see [`super::string_scripts`]'s forget).
pub(super) const FORGET_TRIES: usize = 20;
