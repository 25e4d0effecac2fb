//! The crash drill: the winner's gateway dies mid-call; after the lease a retry through
//! another gateway takes over under a higher fence.

use super::*;

/// The winner's gateway, killed mid-call: when its request was sent, when it died, and
/// whether its client got no answer (it must not: the gateway died before answering).
struct Killed {
    sent: Instant,
    killed_ms: u64,
    first_failed: bool,
}

impl Rig<'_> {
    pub(super) async fn crash(&self, route: &Route, req: &DrillRequest) -> Result<Verdict, String> {
        let killed = self.kill_mid_call(req).await?;
        match route.on_unknown {
            OnUnknown::Retry => self.taken_over(route, req, &killed).await,
            OnUnknown::Hold => self.held(route, req, &killed).await,
        }
    }

    /// Sends `req` through a second gateway, which dies while the upstream holds the call.
    async fn kill_mid_call(&self, req: &DrillRequest) -> Result<Killed, String> {
        // The doomed gateway shares the embedded store (one process) or dials the same
        // Redis; its death takes its tasks, connections and store client with it.
        let shared = match self.config.store.backend {
            StoreBackend::Memory { .. } => Some(self.store.clone()),
            StoreBackend::Redis { .. }
            | StoreBackend::Cluster { .. }
            | StoreBackend::Sentinel { .. } => None,
        };
        let doomed = DoomedGateway::start(self.config.clone(), shared)
            .await
            .map_err(|e| format!("cannot start the second gateway: {e}"))?;
        self.upstream
            .hold_first(&req.key, Duration::from_secs(3600));
        let sent = Instant::now();
        let first = {
            let (http, base, req) = (self.http.clone(), doomed.base(), req.clone());
            tokio::spawn(async move { http.send(&base, &req).await })
        };
        if !self
            .upstream
            .wait_for(&req.key, 1, Duration::from_secs(5))
            .await
        {
            doomed.kill().await;
            return Err("the first request never reached the upstream".into());
        }
        doomed.kill().await;
        let killed_ms = sent.elapsed().as_millis() as u64;
        let first_failed = first.await.map_err(|e| e.to_string())?.is_err();
        Ok(Killed {
            sent,
            killed_ms,
            first_failed,
        })
    }

    /// Retries `req` every 100 ms while it meets the dead claim's live lease (409 or
    /// `ABORTED`, `request-in-flight`), up to the lease and 10 s more; the first other
    /// answer, and every (ms after the kill's send, in flight) on the way.
    async fn retry_past_the_lease(
        &self,
        route: &Route,
        req: &DrillRequest,
        sent: Instant,
    ) -> Result<(Reply, Vec<(u64, bool)>), String> {
        let deadline = sent + self.lease + Duration::from_secs(10);
        let mut attempts: Vec<(u64, bool)> = Vec::new();
        let conflict = GatewayError::Conflict {
            retry_after: Duration::ZERO,
        };
        loop {
            let r = self.send(req).await?;
            let in_flight = r.refused_as(&conflict, &route.errors)
                && r.problem_name().as_deref() == Some("request-in-flight");
            attempts.push((r.sent.duration_since(sent).as_millis() as u64, in_flight));
            if in_flight && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            return Ok((r, attempts));
        }
    }

    /// `on_unknown = "retry"`: after the lease a retry takes over under a higher fence.
    async fn taken_over(
        &self,
        route: &Route,
        req: &DrillRequest,
        killed: &Killed,
    ) -> Result<Verdict, String> {
        let sent = killed.sent;
        let (last, attempts) = self.retry_past_the_lease(route, req, sent).await?;
        let after = self.send(req).await?;
        let effects = self.upstream.effects(&req.key);
        let (f1, f2) = (
            effects.first().and_then(|e| e.fence),
            effects.get(1).and_then(|e| e.fence),
        );
        let higher = matches!((f1, f2), (Some(a), Some(b)) if b > a);
        // The first claim was made after `sent`, so its lease ended no earlier than
        // `sent + lease`: a takeover before that would be a lease not honoured.
        let takeover_after = effects
            .get(1)
            .map(|e| e.at.duration_since(sent))
            .unwrap_or_default();
        let honoured = takeover_after >= self.lease;
        let earlier_all_409 = attempts[..attempts.len() - 1]
            .iter()
            .all(|&(_, in_flight)| in_flight);
        let pass = killed.first_failed
            && effects.len() == 2
            && higher
            && honoured
            && earlier_all_409
            && last.not_failed()
            && !last.replayed()
            && after.replayed()
            && after.same_answer(&last);
        let note = if pass {
            Some("the takeover executed the request again under a higher fence (the documented limit of an unknown outcome); an upstream that refuses lower fences makes the dead owner's write harmless".to_owned())
        } else if effects.len() < 2 {
            Some(format!(
                "no takeover within the lease + 10s: last status {}",
                last.status_text()
            ))
        } else if !honoured {
            Some(format!(
                "taken over {} ms after the first call was sent, before its {} ms lease ended",
                takeover_after.as_millis(),
                self.lease.as_millis()
            ))
        } else {
            Some("the takeover did not behave as expected: see the evidence".to_owned())
        };
        let conflicts = attempts.iter().filter(|a| a.1).count();
        Ok((
            pass,
            evidence(json!({
                "effects": effects.len(),
                "first_fence": f1,
                "takeover_fence": f2,
                "killed_after_ms": killed.killed_ms,
                "retries_409": conflicts,
                "takeover_after_ms": takeover_after.as_millis() as u64,
                "lease_ms": self.lease.as_millis() as u64,
                "takeover_status": last.shown_status(),
                "then_replayed": after.replayed(),
            })),
            note,
        ))
    }

    /// `on_unknown = "hold"`: after the lease the key answers 409 `outcome-unknown`, never
    /// a takeover, until an operator resolves it; resolved with `retry`, the next request
    /// executes under a higher fence.
    async fn held(
        &self,
        route: &Route,
        req: &DrillRequest,
        killed: &Killed,
    ) -> Result<Verdict, String> {
        let (last, attempts) = self.retry_past_the_lease(route, req, killed.sent).await?;
        let held = last.refused_as(&GatewayError::OutcomeUnknown, &route.errors)
            && last.problem_name().as_deref() == Some("outcome-unknown");
        let while_held = self.upstream.effects(&req.key).len();
        let f1 = self
            .upstream
            .effects(&req.key)
            .first()
            .and_then(|e| e.fence);
        // The operator's resolve, as the admin API makes it: under the held claim's fence.
        let store_key = req.store_key(self.config.store.namespace(), &route.name);
        let resolved = match f1 {
            Some(f) => self
                .store
                .resolve(&store_key, Fence::new(f), Resolution::Retry, route.window)
                .await
                .map_err(|e| format!("resolve: {e}"))?,
            None => false,
        };
        let again = self.send(req).await?;
        let after = self.send(req).await?;
        let effects = self.upstream.effects(&req.key);
        let f2 = effects.get(1).and_then(|e| e.fence);
        let higher = matches!((f1, f2), (Some(a), Some(b)) if b > a);
        let pass = killed.first_failed
            && held
            && while_held == 1
            && resolved
            && again.not_failed()
            && !again.replayed()
            && effects.len() == 2
            && higher
            && after.replayed()
            && after.same_answer(&again);
        let note = if pass {
            Some("held: the dead owner's key answered 409 outcome-unknown and never executed again until an operator resolved it; then the next request executed under a higher fence".to_owned())
        } else if !held {
            Some(format!(
                "the dead owner's key was not held: after the lease it answered {} (expected 409 or ABORTED, outcome-unknown)",
                last.status_text()
            ))
        } else {
            Some("the held key did not behave as expected: see the evidence".to_owned())
        };
        Ok((
            pass,
            evidence(json!({
                "effects": effects.len(),
                "effects_while_held": while_held,
                "first_fence": f1,
                "after_resolve_fence": f2,
                "killed_after_ms": killed.killed_ms,
                "retries_409": attempts.len().saturating_sub(1),
                "held_status": last.shown_status(),
                "resolved": resolved,
                "after_resolve_status": again.shown_status(),
                "then_replayed": after.replayed(),
            })),
            note,
        ))
    }
}

/// A second gateway in a runtime of its own on its own thread, so that killing it drops
/// every task it runs (connections, in-flight requests, its store client) at once, as a
/// process dying would: its leases are never settled.
struct DoomedGateway {
    addr: SocketAddr,
    kill: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl DoomedGateway {
    async fn start(config: Config, shared: Option<Store>) -> std::io::Result<Self> {
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let (kill, killed) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
                let store = match shared {
                    Some(s) => s,
                    None => match Store::from_config(&config.store) {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = ready_tx.send(Err(std::io::Error::other(e.to_string())));
                            return;
                        }
                    },
                };
                let public = match TcpListener::bind("127.0.0.1:0").await {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let addr = public.local_addr();
                let _ = ready_tx.send(addr);
                let gateway = Gateway::new(config, store);
                tokio::spawn(serve(
                    gateway,
                    Listeners {
                        public,
                        admin: None,
                        tls: None,
                    },
                    std::future::pending(),
                ));
                let _ = killed.await;
            });
            // No grace, no drain: every task of this gateway is dropped where it stands.
            runtime.shutdown_background();
        });
        let addr = ready
            .await
            .map_err(|_| std::io::Error::other("the second gateway did not start"))??;
        Ok(Self { addr, kill, thread })
    }

    fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn kill(self) {
        let _ = self.kill.send(());
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}
