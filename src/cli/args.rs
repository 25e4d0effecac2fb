//! The command line: `run`, `check`, `drill` and `keys`, with their arguments, as clap
//! parses them.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use super::keys as keys_cli;
use super::manual;

#[derive(Parser)]
#[command(
    version = manual::VERSION,
    about = "A reverse proxy that makes retried HTTP writes safe",
    after_help = "Exit statuses and environment variables: see --help."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
    /// Log format; default: text on a terminal, json otherwise.
    #[arg(long, global = true, value_enum)]
    pub(crate) log_format: Option<LogFormat>,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run the gateway.
    Run {
        /// Configuration file.
        #[arg(long, env = "DEDUPE_CONFIG")]
        config: PathBuf,
    },
    /// Validate a configuration file and print the routes it defines and its warnings; or,
    /// with --request, show what the gateway would do with one request.
    Check {
        /// Configuration file.
        #[arg(long, env = "DEDUPE_CONFIG")]
        config: PathBuf,
        /// Exit 1 when there is any warning (for CI).
        #[arg(long)]
        strict: bool,
        /// Also dial the configured store, authenticate, and report each node's server and
        /// version, whether it has SET ... IFEQ, and the store checks drill makes: exit 69
        /// when it cannot be reached, 1 on a risk (an evicting policy).
        #[arg(long, conflicts_with = "request")]
        store: bool,
        /// A request to explain: "METHOD /path?query".
        #[arg(long, value_name = "METHOD TARGET")]
        request: Option<String>,
        /// A request header, "Name: value" (repeatable); derives the key.
        #[arg(
            short = 'H',
            long = "header",
            value_name = "NAME: VALUE",
            requires = "request"
        )]
        headers: Vec<String>,
        /// The request body; derives the key.
        #[arg(long, requires = "request")]
        body: Option<String>,
    },
    /// Prove dedupe on your setup: replay, lease, crash, race and misuse drills per route,
    /// and store checks. With --target, a black-box run against a live gateway.
    Drill(DrillArgs),
    /// Show, resolve or delete a record (named from the config, as the gateway names it),
    /// or list those held for a person or in flight: through the admin API.
    Keys(keys_cli::KeysArgs),
    /// Print the shell completion script for SHELL, e.g. to
    /// /usr/share/bash-completion/completions/dedupe-gateway.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `dedupe-gateway man | man -l -`; with SUBCOMMAND,
    /// that subcommand's page (dedupe-gateway-SUBCOMMAND(1)).
    Man {
        /// A subcommand (run, check, drill, ...).
        subcommand: Option<String>,
        /// Print the subcommands that have a page of their own, one a line.
        #[arg(long, conflicts_with = "subcommand")]
        list: bool,
    },
}

#[derive(clap::Args)]
pub(crate) struct DrillArgs {
    /// Configuration file: its routes and store (with --target: the file the target runs,
    /// for its routes' key rules).
    #[arg(long, env = "DEDUPE_CONFIG")]
    pub(crate) config: PathBuf,
    /// Drill only this route (repeatable; default every route). With --target, exactly one.
    #[arg(long = "route")]
    pub(crate) routes: Vec<String>,
    /// Report format.
    #[arg(long, value_enum, default_value = "text")]
    pub(crate) format: ReportFormat,
    /// The lease every route gets for the drill (not with --target).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub(crate) lease: std::time::Duration,
    /// Concurrent requests in the race drill.
    #[arg(long, default_value_t = dedupe_gateway::ops::drill::DEFAULT_RACE)]
    pub(crate) race: usize,
    /// A live gateway's public base URL (`http://host:port`): black-box mode.
    #[arg(long, requires = "admin")]
    pub(crate) target: Option<String>,
    /// The live gateway's admin base URL.
    #[arg(long, requires = "target")]
    pub(crate) admin: Option<String>,
    /// The admin bearer token (with --target).
    // Not `requires = "target"`: the deployment's DEDUPE_ADMIN_TOKEN, which its config
    // reads (`token = "env:DEDUPE_ADMIN_TOKEN"`), is set for a drill with --config too.
    #[arg(long, env = "DEDUPE_ADMIN_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// A header sent with every --target request, over the generated one ("Name: value").
    #[arg(long = "header", requires = "target")]
    pub(crate) headers: Vec<String>,
    /// Send the --target requests (they reach the real upstream).
    #[arg(long, requires = "target")]
    pub(crate) yes: bool,
    /// Also drive each route, for a few seconds at a capped rate, past an admission limit
    /// of the drill's own (set low): refusals must come before the claim, nothing may be
    /// left unstored. Local mode only: never with --target.
    #[arg(long, conflicts_with = "target")]
    pub(crate) overload: bool,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum ReportFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}
