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
            "run: stopped after a clean drain; check: the file is valid; drill: every drill passed",
        ),
        (
            EXIT_DRILL_FAILED,
            "drill: a drill or store check failed; check --strict: the file has warnings",
        ),
        (
            EXIT_CONFIG,
            "unusable command line, configuration or environment variable (nothing was bound)",
        ),
        (
            EXIT_UNAVAILABLE,
            "run: a listener could not be bound (address in use, permission)",
        ),
        (EXIT_RUNTIME, "any other failure at run time"),
    ]
}

/// Every environment variable the binary reads, and what for.
fn environment() -> Vec<(&'static str, String)> {
    let mut vars = vec![(
        "DEDUPE_CONFIG",
        "the configuration file, when --config is not given (run, check, drill)".to_owned(),
    )];
    for (var, field) in dedupe_gateway::config::ENV_OVERRIDES {
        let also = match var {
            "DEDUPE_ADMIN_TOKEN" => "; also drill --target's --token",
            "DEDUPE_REDIS_URLS" => " (comma-separated)",
            "DEDUPE_REDIS_PASSWORD" => ", never printed",
            _ => "",
        };
        vars.push((var, format!("overrides {field} of the file{also}")));
    }
    vars.push((
        "RUST_LOG",
        "the log filter (default info); info,dedupe_gateway::access=warn turns access lines off"
            .to_owned(),
    ));
    vars
}

/// The end of `--help`: exit statuses and environment variables.
pub fn long_help() -> String {
    let mut out = String::from("Exit status:\n");
    for (code, when) in exit_statuses() {
        out += &format!("  {code:<3} {when}\n");
    }
    out += "\nEnvironment:\n";
    for (var, what) in environment() {
        out += &format!("  {var:<22} {what}\n");
    }
    out
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
    for (var, what) in environment() {
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

/// The completion script for `shell`.
pub fn completions(shell: clap_complete::Shell, mut cmd: clap::Command) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "dedupe-gateway", &mut out);
    out
}
