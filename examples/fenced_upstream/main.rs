//! An upstream that enforces the gateway's fences: every write is an order recorded in
//! SQLite together with the highest `Idempotency-Fence` seen for its (`Idempotency-Scope`,
//! `Idempotency-Key`), in one transaction; a write under a lower fence (a gateway that froze
//! past its lease and woke up after a takeover) is refused with 409 and changes nothing.
//! Not part of the gateway: the pattern to copy into an upstream (see the book's
//! "Fences the upstream can enforce", docs/guarantees.md).
//!
//! `cargo run --example fenced_upstream -- 127.0.0.1:9000 orders.db`
//! (`GET /orders` lists the orders and the refused stale writes.)

mod ledger;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:9000".into());
    let db = args.next().unwrap_or_else(|| "orders.db".into());
    let ledger = ledger::Ledger::open(std::path::Path::new(&db))?;
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("fenced upstream: orders in {db}, on http://{addr}");
    ledger::serve(listener, ledger).await;
    Ok(())
}
