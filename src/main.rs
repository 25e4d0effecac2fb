//! The `dedupe-gateway` binary: parses the command line, sets up logging, loads the
//! configuration and hands over to the library.
//!
//! Exit status (sysexits.h): 0 after a clean drain, or `check` found the file valid, or
//! every drill passed; 1 a drill or store check failed; 64 unusable command line or
//! configuration (nothing was bound); 69 a listener could not be bound (address in use,
//! permission); 70 any other failure at run time.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use dedupe_gateway::config::{Config, ConfigError};
use dedupe_gateway::ops::check::{explain, summary, Probe};
use dedupe_gateway::telemetry::log::Format;

/// mimalloc instead of glibc's malloc: under load glibc's arenas showed up in profiles as
/// lock contention and consolidation (`benches/throughput`); see [`allocator`].
#[global_allocator]
static ALLOCATOR: allocator::Allocator = allocator::Allocator;

/// Exit status for an unusable command line or configuration (EX_USAGE).
const EXIT_CONFIG: u8 = 64;
/// Exit status when a listener cannot be bound (EX_UNAVAILABLE).
const EXIT_UNAVAILABLE: u8 = 69;
/// Exit status for any other failure at run time (EX_SOFTWARE).
const EXIT_RUNTIME: u8 = 70;
/// Exit status for an unusable `--request` or `-H` (EX_USAGE too).
const EXIT_USAGE: u8 = 64;

mod cli;

use cli::args::{Cli, Command, DrillArgs, LogFormat, ReportFormat};

use cli::keys as keys_cli;
use cli::{allocator, manual};

fn main() -> ExitCode {
    let cli = match manual::parser(Cli::command())
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // --help and --version are not errors.
            return if e.use_stderr() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Check {
            config,
            strict,
            store,
            request,
            headers,
            body,
        } => check(&config, (strict, store), request, &headers, body),
        Command::Drill(args) => drill(args),
        Command::Keys(args) => keys_cli::run(args),
        Command::Completions { shell } => {
            print(&manual::completions(shell, manual::command(Cli::command())))
        }
        Command::Man { list: true, .. } => {
            let names = manual::subcommands(&Cli::command());
            print(format!("{}\n", names.join("\n")).as_bytes())
        }
        Command::Man { subcommand, .. } => {
            match manual::man_page(manual::command(Cli::command()), subcommand.as_deref()) {
                Some(Ok(page)) => print(&page),
                Some(Err(e)) => {
                    report(&format!("cannot render the man page: {e}"));
                    ExitCode::from(EXIT_RUNTIME)
                }
                None => {
                    let known = manual::subcommands(&Cli::command()).join(", ");
                    let name = subcommand.unwrap_or_default();
                    report(&format!("man: no subcommand {name:?}; one of {known}"));
                    ExitCode::from(EXIT_USAGE)
                }
            }
        }
        Command::Run { config: path } => run_gateway(cli.log_format, path),
    }
}

/// `check`: the file's summary, or with `--request` what the gateway would do with one.
fn check(
    config: &std::path::Path,
    (strict, store): (bool, bool),
    request: Option<String>,
    headers: &[String],
    body: Option<String>,
) -> ExitCode {
    let c = match load(config) {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    let printed = match request {
        Some(request) => match probe(&request, headers, body) {
            Ok(p) => write!(std::io::stdout().lock(), "{}", explain(&c, &p)),
            Err(e) => {
                report(&e);
                return ExitCode::from(EXIT_USAGE);
            }
        },
        None => write!(std::io::stdout().lock(), "{}", summary(&c)),
    };
    match printed {
        // A reader that stopped early (`check ... | head -2`) has what it wanted.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            report(&format!("cannot write to stdout: {e}"));
            ExitCode::FAILURE
        }
        _ if strict && !c.warnings.is_empty() => {
            report(&format!(
                "--strict: {} warning(s) (see above)",
                c.warnings.len()
            ));
            ExitCode::FAILURE
        }
        _ if store => check_store(&c),
        _ => ExitCode::SUCCESS,
    }
}

/// `check --store`: the store dialled as the gateway would, its nodes and checks printed.
fn check_store(c: &dedupe_gateway::config::Config) -> ExitCode {
    use dedupe_gateway::ops::check::StoreVerdict;
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let (text, verdict) = runtime.block_on(dedupe_gateway::ops::check::check_store(c));
    let _ = write!(std::io::stdout().lock(), "{text}");
    match verdict {
        StoreVerdict::Passed => ExitCode::SUCCESS,
        StoreVerdict::Risky => {
            report("--store: the store has a risk (see above): duplicates can slip through");
            ExitCode::from(EXIT_DRILL_FAILED)
        }
        StoreVerdict::Unreachable => ExitCode::from(EXIT_UNAVAILABLE),
    }
}

/// `run`: the configuration, logging (and traces when configured), then the gateway until
/// it drains.
fn run_gateway(log_format: Option<LogFormat>, path: PathBuf) -> ExitCode {
    let config = match load(&path) {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let traces = (config.telemetry.as_ref())
        .map(|t| dedupe_gateway::telemetry::traces::export::start(t, runtime.handle()));
    let (layer, exporter) = match traces.transpose() {
        Ok(t) => t.unzip(),
        Err(e) => {
            report(&e.to_string());
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    // Held to the end: dropping it writes out the lines still buffered.
    let _log = match init_tracing(log_format, layer) {
        Ok(guard) => guard,
        Err(e) => {
            report(&format!("cannot start the log's writer thread: {e}"));
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    let workers = match connection_workers(config.server.workers) {
        Ok(w) => w,
        Err(code) => return code,
    };
    let result = runtime.block_on(dedupe_gateway::edge::server::run(
        config,
        Some(path),
        &workers,
    ));
    // What the drain's grace cut off on the workers goes, with the workers' own Redis
    // connections, before the main runtime's.
    workers.stop();
    // Outside the runtime, while it still runs the exporter's task: the last spans.
    if let Some(Err(e)) = exporter.map(|x| x.shutdown()) {
        tracing::warn!("traces: {e}");
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let bind = matches!(e, dedupe_gateway::edge::server::RunError::Bind { .. });
            // Once, through the log: stderr in either log format.
            tracing::error!("{:#}", anyhow::Error::new(e));
            ExitCode::from(if bind { EXIT_UNAVAILABLE } else { EXIT_RUNTIME })
        }
    }
}

fn load(path: &std::path::Path) -> Result<Config, anyhow::Error> {
    Config::load(path, |k| std::env::var(k).ok()).map_err(|e| {
        // A bad DEDUPE_* variable is not the file's fault: say which one it is.
        let context = match e {
            ConfigError::Env { .. } => "invalid environment".to_owned(),
            _ => format!("invalid configuration {}", path.display()),
        };
        anyhow::Error::new(e).context(context)
    })
}

/// `--request "POST /path"`, `-H "Name: value"` and `--body` as a [`Probe`].
fn probe(request: &str, headers: &[String], body: Option<String>) -> Result<Probe, String> {
    let (method, target) = request
        .trim()
        .split_once(' ')
        .ok_or_else(|| format!("--request {request:?}: expected \"METHOD /path\""))?;
    let method = http::Method::from_bytes(method.as_bytes())
        .map_err(|_| format!("--request: {method:?} is not a method"))?;
    let target = target.trim();
    if !target.starts_with('/') {
        return Err(format!("--request: {target:?} must start with '/'"));
    }
    let mut map = http::HeaderMap::new();
    for h in headers {
        let (name, value) = h
            .split_once(':')
            .ok_or_else(|| format!("-H {h:?}: expected \"Name: value\""))?;
        let name = http::HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| format!("-H {h:?}: {name:?} is not a header name"))?;
        let value = http::HeaderValue::from_str(value.trim())
            .map_err(|_| format!("-H {h:?}: the value is not a header value"))?;
        map.append(name, value);
    }
    Ok(Probe {
        method,
        target: target.to_owned(),
        derive: !headers.is_empty() || body.is_some(),
        headers: map,
        body: body.unwrap_or_default().into_bytes(),
    })
}

fn config_error(e: &anyhow::Error) -> ExitCode {
    report(&format!("{e:#}"));
    ExitCode::from(EXIT_CONFIG)
}

/// Writes `bytes` to stdout; a reader that stopped early (`| head`) is no failure.
fn print(bytes: &[u8]) -> ExitCode {
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            report(&format!("cannot write to stdout: {e}"));
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    }
}

/// Prints a message on stderr. Unlike `eprintln!`, a closed stderr is no panic: the exit
/// status still tells what happened.
fn report(message: &str) {
    let _ = writeln!(std::io::stderr(), "dedupe-gateway: {message}");
}

/// The multi-threaded runtime `run` and `drill` work on; a failure already reported.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    dedupe_gateway::runtime::multi_thread().map_err(|e| {
        report(&format!("cannot start the async runtime: {e}"));
        ExitCode::from(EXIT_RUNTIME)
    })
}

/// `server.workers` connection workers, else one per CPU the process may use; a failure
/// already reported.
fn connection_workers(count: Option<usize>) -> Result<dedupe_gateway::runtime::Workers, ExitCode> {
    let count = dedupe_gateway::runtime::worker_count(count);
    dedupe_gateway::runtime::workers(count).map_err(|e| {
        report(&format!("cannot start the connection workers: {e}"));
        ExitCode::from(EXIT_RUNTIME)
    })
}

/// Exit status when a drill or a store check failed.
const EXIT_DRILL_FAILED: u8 = 1;

fn drill(args: DrillArgs) -> ExitCode {
    use dedupe_gateway::ops::drill::{local, target};
    let config = match load(&args.config) {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    let runtime = match runtime() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let result = match (&args.target, &args.admin) {
        (Some(t), Some(a)) => {
            let plan = match target_plan(&args, &config, t, a) {
                Ok(plan) => plan,
                Err(message) => {
                    report(&message);
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            // Printed first, so a person sees what would reach their upstream.
            let _ = write!(std::io::stderr(), "{}", plan.describe());
            if !args.yes {
                report("drill --target sends real requests to the real upstream: refusing without --yes");
                return ExitCode::from(EXIT_CONFIG);
            }
            runtime.block_on(target::run(&plan))
        }
        _ => {
            let opts = local::LocalOptions {
                routes: args.routes.clone(),
                lease: args.lease,
                race: args.race,
                overload: args.overload,
            };
            runtime.block_on(local::run(config, &opts))
        }
    };
    // The doomed gateway of the crash drill is already gone; nothing else may linger.
    runtime.shutdown_background();
    let drilled = match result {
        Ok(r) => r,
        Err(e) => {
            report(&format!("drill: {e}"));
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let text = match args.format {
        ReportFormat::Text => drilled.to_text(),
        ReportFormat::Json => drilled.to_json() + "\n",
    };
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    if drilled.pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_DRILL_FAILED)
    }
}

/// `drill --target`'s plan: one route, the `--header`s, the admin access; what is wrong
/// with them as a message.
fn target_plan(
    args: &DrillArgs,
    config: &Config,
    target: &str,
    admin: &str,
) -> Result<dedupe_gateway::ops::drill::target::Plan, String> {
    use dedupe_gateway::ops::drill::target;
    let [route] = args.routes.as_slice() else {
        return Err("drill --target: name exactly one --route".to_owned());
    };
    let mut headers = http::HeaderMap::new();
    for h in &args.headers {
        let (name, value) = dedupe_gateway::ops::drill::request::parse_header(h)
            .map_err(|e| format!("--header: {e}"))?;
        headers.insert(name, value);
    }
    let opts = target::TargetOptions {
        target: target.to_owned(),
        admin: admin.to_owned(),
        token: args.token.clone(),
        route: route.clone(),
        headers,
        race: args.race,
    };
    target::Plan::new(config, &opts).map_err(|e| e.to_string())
}

/// Logs to stderr in `format` (text on a terminal, JSON otherwise) through the library's
/// one writer thread.
fn init_tracing(
    format: Option<LogFormat>,
    traces: Option<dedupe_gateway::telemetry::traces::export::TraceLayer>,
) -> std::io::Result<dedupe_gateway::telemetry::log::sink::Guard> {
    let terminal = std::io::stderr().is_terminal();
    let format = match format {
        Some(LogFormat::Text) => Format::Text,
        Some(LogFormat::Json) => Format::Json,
        None if terminal => Format::Text,
        None => Format::Json,
    };
    dedupe_gateway::telemetry::log::install(format, terminal, traces)
}
