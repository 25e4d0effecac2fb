//! The binary's `keys` subcommand: its arguments, and its answers and exit statuses. The
//! work (naming the record, calling the admin API, the output) is the library's
//! [`dedupe_gateway::ops::keys`].

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use dedupe_gateway::ops::keys::act::{self, ResolveAs};
use dedupe_gateway::ops::keys::client::Admin;
use dedupe_gateway::ops::keys::{self, output, KeyArgs, KeysError};

use crate::{load, report, EXIT_CONFIG, EXIT_DRILL_FAILED, EXIT_RUNTIME, EXIT_UNAVAILABLE};

/// `keys`: one action.
#[derive(Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Show one record as the gateway keeps it (state, fence, lease, attempts).
    Show {
        #[command(flatten)]
        record: Record,
        #[command(flatten)]
        out: Out,
    },
    /// Settle a claim by hand (an unknown outcome held for a person): `--as retry` frees
    /// the key, `--as done` completes it with a response; under the fence `show` or `list`
    /// showed.
    Resolve(ResolveArgs),
    /// Forget one record: the next request with its key executes again.
    Delete {
        #[command(flatten)]
        record: Record,
        /// Only if the record is still under this fence.
        #[arg(long)]
        fence: Option<u64>,
        /// Act even on a claim whose lease is live.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        out: Out,
    },
    /// List the records in a state: held for a person, or in flight.
    List {
        /// held: unknown outcomes waiting for a person; in-flight: claims without an outcome.
        #[arg(long, value_enum)]
        state: State,
        /// Only this route's records.
        #[arg(long)]
        route: Option<String>,
        /// At most this many (the admin API's default 100, at most 1000).
        #[arg(long)]
        limit: Option<usize>,
        /// Go on where a truncated listing stopped.
        #[arg(long)]
        cursor: Option<String>,
        #[command(flatten)]
        out: Out,
    },
}

/// `keys resolve`: the record, and the admin API's fields.
#[derive(Args)]
struct ResolveArgs {
    #[command(flatten)]
    record: Record,
    /// The fence `keys show` or `keys list` showed: under any other, refused.
    #[arg(long)]
    fence: u64,
    /// retry: the next request executes; done: the key answers the given response.
    #[arg(long = "as", value_enum)]
    resolve_as: As,
    /// With --as done: the response's status (200 to 599).
    #[arg(long)]
    status: Option<u16>,
    /// With --as done: a response header, "Name: value" (repeatable).
    #[arg(long = "response-header", value_name = "NAME: VALUE")]
    response_headers: Vec<String>,
    /// With --as done: the response's body.
    #[arg(long)]
    response_body: Option<String>,
    /// Act even on a claim whose lease is live.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    out: Out,
}

/// Which record, named as a request names it.
#[derive(Args)]
struct Record {
    /// Configuration file: the routes' key and scope rules and the store's prefix.
    #[arg(long, env = "DEDUPE_CONFIG")]
    config: PathBuf,
    /// The route.
    #[arg(long)]
    route: String,
    /// The idempotency key, as the client sent it. On a fingerprint route: the fingerprint
    /// (as `keys list` shows it), or leave it out to derive it from -H, --body, --request.
    #[arg(long)]
    key: Option<String>,
    /// A request header, "Name: value" (repeatable): the scope's headers (e.g.
    /// "Authorization: Bearer ..."), a fingerprint's.
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// The request body, for a fingerprint or an order that reads it.
    #[arg(long)]
    body: Option<String>,
    /// "METHOD /path?query", for a fingerprint or scope that reads them.
    #[arg(long, value_name = "METHOD TARGET")]
    request: Option<String>,
}

/// Where the admin API is, and how to print its answer.
#[derive(Args)]
struct Out {
    /// The gateway's admin base URL (`http://host:port`, `[admin] listen`).
    #[arg(long)]
    admin: String,
    /// The admin bearer token (`[admin] token`).
    #[arg(long, env = "DEDUPE_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
}

#[derive(Clone, Copy, ValueEnum)]
enum As {
    Retry,
    Done,
}

#[derive(Clone, Copy, ValueEnum)]
enum State {
    Held,
    InFlight,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// Runs one `keys` action: 0 done; 1 the admin API refused (its problem is printed); 64
/// unusable arguments or config; 69 the admin API cannot be reached; 70 anything else.
pub fn run(args: KeysArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            report(&format!("cannot start the async runtime: {e}"));
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    let (name, format) = match &args.action {
        Action::Show { out, .. } => ("show", out.format),
        Action::Resolve(args) => ("resolve", args.out.format),
        Action::Delete { out, .. } => ("delete", out.format),
        Action::List { out, .. } => ("list", out.format),
    };
    let answer = match runtime.block_on(act_on(args.action)) {
        Ok(answer) => answer,
        Err(e) => {
            report(&format!("keys {name}: {e}"));
            return ExitCode::from(exit_status(&e));
        }
    };
    let text = match format {
        Format::Json => format!("{answer}\n"),
        Format::Text if name == "list" => output::listing(&answer),
        Format::Text => output::fields(&answer),
    };
    if let Some(other) = answer.get("derived_store_key") {
        report(&format!(
            "keys {name}: the gateway names this record {} but the config derives {other}: does it run another config?",
            answer["store_key"]
        ));
    }
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    ExitCode::SUCCESS
}

fn exit_status(e: &KeysError) -> u8 {
    match e {
        KeysError::Usage(_) | KeysError::Derive(_) => EXIT_CONFIG,
        KeysError::Refused { .. } => EXIT_DRILL_FAILED,
        KeysError::Unreachable { .. } => EXIT_UNAVAILABLE,
        KeysError::Reply(_) => EXIT_RUNTIME,
    }
}

async fn act_on(action: Action) -> Result<serde_json::Value, KeysError> {
    match action {
        Action::Show { record, out } => {
            let located = locate(&record)?;
            let shown = act::show(&admin(&out)?, &located).await;
            shown.map_err(|e| hinted(e, &located))
        }
        Action::Resolve(args) => {
            let located = locate(&args.record)?;
            let resolved = act::resolve(&admin(&args.out)?, &located, &resolution(&args)?).await;
            resolved.map_err(|e| hinted(e, &located))
        }
        Action::Delete {
            record,
            fence,
            force,
            out,
        } => {
            let located = locate(&record)?;
            let deleted = act::delete(&admin(&out)?, &located, fence, force).await;
            deleted.map_err(|e| hinted(e, &located))
        }
        Action::List {
            state,
            route,
            limit,
            cursor,
            out,
        } => {
            let req = act::List {
                state: match state {
                    State::Held => "held",
                    State::InFlight => "in-flight",
                }
                .to_owned(),
                route,
                limit,
                cursor,
            };
            act::list(&admin(&out)?, &req).await
        }
    }
}

/// The admin API's refusal with what the command line can add: for "no record", the
/// scope parts its name was derived without; for a stale fence, how to read the record's
/// fence now.
fn hinted(e: KeysError, located: &keys::Located) -> KeysError {
    let KeysError::Refused {
        status,
        problem_type,
        title,
        detail,
    } = e
    else {
        return e;
    };
    let is = |name: &str| problem_type.as_deref().is_some_and(|t| t.ends_with(name));
    let hint = if is("record-not-found") {
        located.not_found_hint()
    } else if is("stale-fence") {
        Some(format!(
            "read its fence now with `dedupe-gateway keys show --route {} ...` (the same \
             record arguments), then act under that fence",
            located.route
        ))
    } else {
        None
    };
    let detail = match (detail, hint) {
        (Some(d), Some(h)) => Some(format!("{d}; {h}")),
        (d, h) => d.or(h),
    };
    KeysError::Refused {
        status,
        problem_type,
        title,
        detail,
    }
}

/// The admin API's resolve request from `keys resolve`'s flags.
fn resolution(args: &ResolveArgs) -> Result<act::Resolve, KeysError> {
    let mut headers = std::collections::BTreeMap::new();
    for (name, value) in keys::parse_headers(&args.response_headers)?.iter() {
        let value = value.to_str().unwrap_or_default().to_owned();
        headers.insert(name.as_str().to_owned(), value);
    }
    Ok(act::Resolve {
        fence: args.fence,
        resolve_as: match args.resolve_as {
            As::Retry => ResolveAs::Retry,
            As::Done => ResolveAs::Done,
        },
        status: args.status,
        headers,
        body: args.response_body.clone(),
        force: args.force,
    })
}

fn admin(out: &Out) -> Result<Admin, KeysError> {
    Admin::new(&out.admin, out.token.clone())
}

fn locate(record: &Record) -> Result<keys::Located, KeysError> {
    let config = load(&record.config).map_err(|e| KeysError::Usage(format!("{e:#}")))?;
    let args = KeyArgs {
        route: record.route.clone(),
        key: record.key.clone(),
        request: record.request.clone(),
        headers: record.headers.clone(),
        body: record.body.clone(),
    };
    keys::locate(&config, &args)
}
