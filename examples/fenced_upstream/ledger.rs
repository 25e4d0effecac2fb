//! The fenced ledger: SQLite tables and the HTTP service in front of them. Kept apart from
//! `main` so the zombie drill (`tests/zombie.rs`) runs this very code in-process.
//!
//! The rule, in one transaction per write:
//!
//! 1. read the highest fence recorded for (scope, key);
//! 2. a lower fence is stale: refuse it (409), write nothing (the refusal is kept in
//!    `stale_writes` for an operator);
//! 3. otherwise record the new fence, and do the business write unless this (scope, key)
//!    already has one (a takeover of a call whose write did land answers that write again
//!    rather than writing twice).
//!
//! The fence check and the business write share the transaction, so no interleaving of a
//! zombie and its successor writes twice or lets the lower fence win. The scope keeps two
//! tenants' `order-1` apart.

use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use tokio::net::TcpListener;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fences (
  scope TEXT NOT NULL, key TEXT NOT NULL, fence INTEGER NOT NULL,
  PRIMARY KEY (scope, key));
CREATE TABLE IF NOT EXISTS orders (
  id INTEGER PRIMARY KEY, scope TEXT NOT NULL, key TEXT NOT NULL, fence INTEGER NOT NULL,
  body TEXT NOT NULL, UNIQUE (scope, key));
CREATE TABLE IF NOT EXISTS stale_writes (
  scope TEXT NOT NULL, key TEXT NOT NULL, fence INTEGER NOT NULL, highest INTEGER NOT NULL);
";

/// What one write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// A new order under this fence.
    Created { order: i64 },
    /// The (scope, key) already has its order (written under an earlier or the same
    /// fence): nothing new was written.
    Existing { order: i64 },
    /// The fence is lower than one already recorded: refused, nothing written.
    Stale { highest: i64 },
}

/// The orders database. Clones share one connection (SQLite serialises writers anyway).
#[derive(Clone)]
pub struct Ledger {
    db: Arc<Mutex<Connection>>,
}

impl Ledger {
    /// Opens (or creates) the database file.
    pub fn open(path: &Path) -> rusqlite::Result<Self> {
        let db = Connection::open(path)?;
        db.execute_batch(SCHEMA)?;
        Ok(Self {
            db: Arc::new(Mutex::new(db)),
        })
    }

    /// Records an order for (scope, key) under `fence`, or refuses a stale fence: one
    /// transaction.
    pub fn write(&self, scope: &str, key: &str, fence: i64, body: &str) -> rusqlite::Result<Write> {
        let mut db = self.db.lock().unwrap_or_else(|e| e.into_inner());
        // IMMEDIATE takes the write lock first: two writers of one key serialise here,
        // not at commit.
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let highest: Option<i64> = tx
            .query_row(
                "SELECT fence FROM fences WHERE scope = ?1 AND key = ?2",
                params![scope, key],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(highest) = highest.filter(|&h| fence < h) {
            tx.execute(
                "INSERT INTO stale_writes (scope, key, fence, highest) VALUES (?1, ?2, ?3, ?4)",
                params![scope, key, fence, highest],
            )?;
            tx.commit()?;
            return Ok(Write::Stale { highest });
        }
        tx.execute(
            "INSERT INTO fences (scope, key, fence) VALUES (?1, ?2, ?3)
             ON CONFLICT (scope, key) DO UPDATE SET fence = excluded.fence",
            params![scope, key, fence],
        )?;
        let existing: Option<i64> = tx
            .query_row(
                "SELECT id FROM orders WHERE scope = ?1 AND key = ?2",
                params![scope, key],
                |r| r.get(0),
            )
            .optional()?;
        let write = match existing {
            Some(order) => Write::Existing { order },
            None => {
                tx.execute(
                    "INSERT INTO orders (scope, key, fence, body) VALUES (?1, ?2, ?3, ?4)",
                    params![scope, key, fence, body],
                )?;
                Write::Created {
                    order: tx.last_insert_rowid(),
                }
            }
        };
        tx.commit()?;
        Ok(write)
    }

    /// Every order (scope, key, fence) and every refused stale write (scope, key, fence,
    /// highest), as JSON.
    pub fn report(&self) -> rusqlite::Result<serde_json::Value> {
        let db = self.db.lock().unwrap_or_else(|e| e.into_inner());
        let mut orders = db.prepare("SELECT id, scope, key, fence FROM orders ORDER BY id")?;
        let orders = orders
            .query_map([], |r| {
                Ok(serde_json::json!({
                    "order": r.get::<_, i64>(0)?, "scope": r.get::<_, String>(1)?,
                    "key": r.get::<_, String>(2)?, "fence": r.get::<_, i64>(3)?,
                }))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut stale = db.prepare("SELECT scope, key, fence, highest FROM stale_writes")?;
        let stale = stale
            .query_map([], |r| {
                Ok(serde_json::json!({
                    "scope": r.get::<_, String>(0)?, "key": r.get::<_, String>(1)?,
                    "fence": r.get::<_, i64>(2)?, "highest": r.get::<_, i64>(3)?,
                }))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(serde_json::json!({ "orders": orders, "stale_writes": stale }))
    }
}

/// Serves the ledger on `listener` (HTTP/1.1) until the runtime ends.
pub async fn serve(listener: TcpListener, ledger: Ledger) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let ledger = ledger.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| answer(ledger.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn answer(
    ledger: Ledger,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    if parts.method == Method::GET {
        return Ok(match ledger.report() {
            Ok(report) => json(StatusCode::OK, report),
            Err(e) => json(StatusCode::INTERNAL_SERVER_ERROR, error(&e.to_string())),
        });
    }
    let Ok(body) = body.collect().await.map(|c| c.to_bytes()) else {
        return Ok(json(StatusCode::BAD_REQUEST, error("body broke off")));
    };
    let key = header(&parts.headers, "idempotency-key");
    let fence = header(&parts.headers, "idempotency-fence").and_then(|f| f.parse::<i64>().ok());
    let (Some(key), Some(fence)) = (key, fence) else {
        // Only the gateway's winner carries a fence: a write that bypassed it is refused
        // rather than executed unguarded.
        return Ok(json(
            StatusCode::PRECONDITION_REQUIRED,
            error("Idempotency-Key and Idempotency-Fence required"),
        ));
    };
    // `-`: a route without scope. Either way the scope is part of the ledger's key.
    let scope = header(&parts.headers, "idempotency-scope").unwrap_or("-");
    let text = String::from_utf8_lossy(&body).into_owned();
    // SQLite blocks: off the async workers.
    let (s, k) = (scope.to_owned(), key.to_owned());
    let written = tokio::task::spawn_blocking(move || ledger.write(&s, &k, fence, &text)).await;
    Ok(match written {
        Ok(Ok(Write::Created { order })) => json(
            StatusCode::CREATED,
            serde_json::json!({ "order": order, "fence": fence }),
        ),
        Ok(Ok(Write::Existing { order })) => json(
            StatusCode::OK,
            serde_json::json!({ "order": order, "fence": fence }),
        ),
        Ok(Ok(Write::Stale { highest })) => {
            eprintln!(
                "fenced upstream: refused stale fence {fence} for key {key} (highest {highest})"
            );
            json(
                StatusCode::CONFLICT,
                serde_json::json!({ "error": "stale fence", "fence": fence, "highest": highest }),
            )
        }
        Ok(Err(e)) => json(StatusCode::INTERNAL_SERVER_ERROR, error(&e.to_string())),
        Err(e) => json(StatusCode::INTERNAL_SERVER_ERROR, error(&e.to_string())),
    })
}

fn error(message: &str) -> serde_json::Value {
    serde_json::json!({ "error": message })
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(format!("{value}\n"))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}
