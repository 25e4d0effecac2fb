//! What the binary says about itself: `--version`, the exit statuses and environment
//! variables `--help` lists, the man page (`dedupe-gateway man`) and shell completions
//! (`dedupe-gateway completions SHELL`), all from the one clap definition in `main.rs`.

use clap_mangen::roff::{bold, roman, Roff};

use crate::{EXIT_CONFIG, EXIT_DRILL_FAILED, EXIT_RUNTIME, EXIT_UNAVAILABLE};

/// `--version`: the package version, the commit and the build date (see `build.rs`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("DEDUPE_BUILD_COMMIT"),
    ", built ",
    env!("DEDUPE_BUILD_DATE"),
    ")"
);

/// Every exit status and when the binary exits with it.
fn exit_statuses() -> [(u8, &'static str); 5] {
    [
        (
            0,
            "run: stopped after a clean drain; check: the file is valid; drill: every drill passed; keys: done",
        ),
        (
            EXIT_DRILL_FAILED,
            "drill: a drill or store check failed; check --strict: the file has warnings; keys: the admin API refused (its problem is printed: not found, stale fence, claim live, unauthorized)",
        ),
        (
            EXIT_CONFIG,
            "unusable command line, configuration or environment variable (nothing was bound)",
        ),
        (
            EXIT_UNAVAILABLE,
            "run: a listener could not be bound (address in use, permission); keys: the admin API cannot be reached",
        ),
        (EXIT_RUNTIME, "any other failure at run time"),
    ]
}

/// Every environment variable the binary reads, and what for: the arguments' (`env =` in
/// `main.rs`, found in the clap definition, so a new one is listed without a word here),
/// the overrides of the file's fields, and `RUST_LOG`.
fn environment(cmd: &clap::Command) -> Vec<(String, String)> {
    // Each argument's variable, with the subcommands that read it.
    let mut args: Vec<(String, String, Vec<String>)> = Vec::new();
    for (name, sub) in subcommands_within(cmd, "") {
        for arg in sub.get_arguments() {
            let Some(var) = arg.get_env().and_then(|v| v.to_str()) else {
                continue;
            };
            let flag = arg
                .get_long()
                .map_or_else(|| arg.get_id().to_string(), |l| format!("--{l}"));
            match args.iter_mut().find(|(v, f, _)| v == var && *f == flag) {
                Some((_, _, subs)) => subs.push(name.clone()),
                None => args.push((var.to_owned(), flag, vec![name.clone()])),
            }
        }
    }
    let read_as = |var: &str| {
        args.iter()
            .filter(|(v, _, _)| v == var)
            .map(|(_, flag, subs)| format!("{flag} ({}) when not given", subs.join(", ")))
            .collect::<Vec<_>>()
    };
    let mut vars = Vec::new();
    for (var, _, _) in &args {
        let overridden = dedupe_gateway::config::ENV_OVERRIDES
            .iter()
            .any(|(v, _)| v == var);
        if !overridden && !vars.iter().any(|(v, _)| v == var) {
            vars.push((var.clone(), read_as(var).join("; ")));
        }
    }
    for (var, field) in dedupe_gateway::config::ENV_OVERRIDES {
        let mut what = format!("overrides {field} of the file");
        match var {
            "DEDUPE_REDIS_URLS" => what += " (comma-separated)",
            // Not a field of the file: a password there would sit beside everything else.
            "DEDUPE_REDIS_PASSWORD" => {
                what = format!(
                    "{field}, which the file has no field for: used in place of one in the \
                     store URLs (with sentinels, the primary's); never printed"
                )
            }
            _ => {}
        }
        let also = read_as(var);
        if !also.is_empty() {
            what += &format!("; also {}", also.join("; "));
        }
        vars.push((var.to_owned(), what));
    }
    vars.push((
        "RUST_LOG".to_owned(),
        "the log filter (default info); info,dedupe_gateway::access=warn turns access lines off"
            .to_owned(),
    ));
    vars
}

/// Every subcommand, nested ones too (`keys show`), with its name as typed.
fn subcommands_within<'c>(cmd: &'c clap::Command, above: &str) -> Vec<(String, &'c clap::Command)> {
    let mut out = Vec::new();
    for sub in cmd.get_subcommands() {
        let name = format!("{above}{}", sub.get_name());
        out.extend(subcommands_within(sub, &format!("{name} ")));
        out.push((name, sub));
    }
    out
}

/// The command with `--help`'s epilogue: exit statuses and environment variables.
pub fn command(cmd: clap::Command) -> clap::Command {
    let mut out = String::from("Exit status:\n");
    for (code, when) in exit_statuses() {
        out += &format!("  {code:<3} {when}\n");
    }
    out += "\nEnvironment:\n";
    for (var, what) in environment(&cmd) {
        out += &format!("  {var:<22} {what}\n");
    }
    cmd.after_long_help(out)
}

/// The command as it parses: every subcommand's usage line is the one its `--help` shows.
///
/// Left to itself, clap writes an error's usage line from the arguments that were used,
/// those taken from the environment included, and prints each bare, as if required:
/// `keys list --state <STATE> --admin <ADMIN> --token <TOKEN>` for a `--token` that
/// `DEDUPE_ADMIN_TOKEN` gave. Here each line is fixed when the command is built, from the
/// definition alone: required arguments bare, the optional ones behind `[OPTIONS]`.
pub fn parser(cmd: clap::Command) -> clap::Command {
    let mut cmd = command(cmd);
    cmd.build();
    usage_as_help(&mut cmd);
    cmd
}

/// Sets `cmd`'s and each subcommand's usage line to the one rendered with no argument used.
fn usage_as_help(cmd: &mut clap::Command) {
    let usage = cmd.render_usage().to_string();
    let usage = usage.strip_prefix("Usage: ").unwrap_or(&usage).to_owned();
    *cmd = std::mem::take(cmd).override_usage(usage);
    for sub in cmd.get_subcommands_mut() {
        usage_as_help(sub);
    }
}

/// The subcommands with a page of their own (`dedupe-gateway-run(1)`, ...).
pub fn subcommands(cmd: &clap::Command) -> Vec<String> {
    cmd.get_subcommands()
        .filter(|s| s.get_name() != "help")
        .map(|s| s.get_name().to_owned())
        .collect()
}

/// A man page (roff): `dedupe-gateway(1)`, or with `subcommand` its own page
/// (`dedupe-gateway-run(1)`), as the main page's SUBCOMMANDS section names them. `None`
/// when there is no such subcommand.
pub fn man_page(cmd: clap::Command, subcommand: Option<&str>) -> Option<std::io::Result<Vec<u8>>> {
    // The help subcommand has no page; global options are copied into each subcommand.
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    match subcommand {
        None => Some(main_page(cmd)),
        Some(name) => {
            let sub = cmd.find_subcommand(name)?.clone();
            let sub = sub
                .name(format!("dedupe-gateway-{name}"))
                .version(env!("CARGO_PKG_VERSION"));
            let mut out = Vec::new();
            Some(clap_mangen::Man::new(sub).render(&mut out).map(|()| out))
        }
    }
}

/// `dedupe-gateway(1)`: clap's sections, then EXIT STATUS and ENVIRONMENT as tagged
/// paragraphs, the other pages, and the version.
fn main_page(cmd: clap::Command) -> std::io::Result<Vec<u8>> {
    let pages: Vec<String> = subcommands(&cmd)
        .iter()
        .map(|s| format!("dedupe-gateway-{s}(1)"))
        .collect();
    let variables = environment(&cmd);
    // `--help`'s epilogue is rendered below as sections of their own, not as clap's EXTRA
    // section of run-on lines. The page's footer has room for the package version only;
    // the commit and the build date go to the VERSION section.
    let cmd = cmd
        .after_long_help(None::<&str>)
        .after_help(None::<&str>)
        .version(env!("CARGO_PKG_VERSION"));
    let man = clap_mangen::Man::new(cmd);
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    man.render_subcommands_section(&mut out)?;
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for (code, when) in exit_statuses() {
        roff.control("TP", [])
            .text([bold(code.to_string())])
            .text([roman(when)]);
    }
    roff.control("SH", ["ENVIRONMENT"]);
    for (var, what) in variables {
        roff.control("TP", []).text([bold(var)]).text([roman(what)]);
    }
    roff.control("SH", ["SEE ALSO"]);
    roff.text([roman(format!(
        "{}; the README and docs/ of the source repository.",
        pages.join(", ")
    ))]);
    roff.control("SH", ["VERSION"]);
    roff.text([roman(format!("dedupe-gateway {VERSION}"))]);
    roff.to_writer(&mut out)?;
    Ok(out)
}

/// The name the completions complete.
const BIN: &str = "dedupe-gateway";

/// The completion script for `shell`.
pub fn completions(shell: clap_complete::Shell, mut cmd: clap::Command) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, BIN, &mut out);
    match shell {
        clap_complete::Shell::Bash => bash_states_agree(out),
        _ => out,
    }
}

/// clap_complete's bash script (4.6.12 and before; clap-rs/clap#6421, open) spells the
/// state it walks to as `dedupe__gateway__subcmd__keys` and labels the branch for it
/// `dedupe__subcmd__gateway__subcmd__keys` (the bin name's hyphen escaped as a
/// subcommand separator), so nothing past the first word completed. The labels are
/// spelled as the walk spells them; a clap_complete that fixes it leaves nothing to do.
fn bash_states_agree(script: Vec<u8>) -> Vec<u8> {
    let script = String::from_utf8(script).expect("clap_complete writes UTF-8");
    let label = BIN.replace('-', "__subcmd__");
    let state = BIN.replace('-', "__");
    script.replace(&label, &state).into_bytes()
}
