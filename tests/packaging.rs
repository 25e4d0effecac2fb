//! What ships with the binary: the Debian package (built by `scripts/deb` from the test
//! build, then taken apart with dpkg-deb), its systemd unit and default config, the man
//! pages and shell completions, `--version` and `--help`, the Dockerfile, LICENSE,
//! CHANGELOG.md and the stability statement.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn gateway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8(run(cmd).stdout).unwrap()
}

// ---------------------------------------------------------------------------------------
// The command line
// ---------------------------------------------------------------------------------------

#[test]
fn version_names_the_commit_and_the_build_date() {
    let line = stdout(gateway().arg("--version"));
    let rest = line
        .trim_end()
        .strip_prefix(concat!(
            "dedupe-gateway ",
            env!("CARGO_PKG_VERSION"),
            " (commit "
        ))
        .unwrap_or_else(|| panic!("{line}"));
    let (commit, date) = rest
        .strip_suffix(')')
        .and_then(|r| r.split_once(", built "))
        .unwrap_or_else(|| panic!("{line}"));
    // Built from a checkout (as here): the commit the build saw, which is HEAD's.
    let head = Command::new("git")
        .args(["rev-parse", "--short=10", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_owned());
    match head {
        Some(head) if std::env::var("DEDUPE_BUILD_COMMIT").is_err() => {
            assert_eq!(commit, head, "{line}")
        }
        _ => assert!(!commit.is_empty(), "{line}"),
    }
    let parts: Vec<u32> = date.split('-').map(|p| p.parse().unwrap()).collect();
    assert!(
        matches!(parts[..], [y, 1..=12, 1..=31] if y >= 2026),
        "{line}"
    );
    assert_eq!(stdout(gateway().arg("-V")), line);
}

/// `build.rs`, for its date arithmetic: build scripts have no tests of their own.
#[allow(dead_code)]
#[path = "../build.rs"]
mod build_script;

#[test]
fn the_build_date_is_the_calendar_date() {
    assert_eq!(build_script::date(0), "1970-01-01");
    assert_eq!(build_script::date(951_782_400), "2000-02-29");
    assert_eq!(build_script::date(1_709_164_800), "2024-02-29");
    assert_eq!(build_script::date(1_798_761_599), "2026-12-31");
    assert_eq!(build_script::date(4_107_542_400), "2100-03-01");
}

#[test]
fn help_lists_exit_statuses_and_environment_variables() {
    let help = stdout(gateway().arg("--help"));
    for code in ["0 ", "1 ", "64 ", "69 ", "70 "] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(code)),
            "exit status {code}missing:\n{help}"
        );
    }
    let mut vars: Vec<&str> = dedupe_gateway::config::ENV_OVERRIDES
        .iter()
        .map(|(var, _)| *var)
        .collect();
    // Every `env = "..."` of an argument of the binary's (main.rs and cli/).
    let main = ["src/main.rs", "src/cli/args.rs", "src/cli/keys.rs"]
        .map(|f| std::fs::read_to_string(f).unwrap())
        .concat();
    vars.extend(
        main.split("env = \"")
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap()),
    );
    vars.push("RUST_LOG");
    assert!(vars.contains(&"DEDUPE_CONFIG"), "{vars:?}");
    for var in vars {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(var)),
            "{var} missing:\n{help}"
        );
    }
    let short = stdout(gateway().arg("-h"));
    assert!(short.contains("see --help"), "{short}");
}

#[test]
fn completions_cover_every_subcommand_in_each_shell() {
    let subcommands = stdout(gateway().args(["man", "--list"]));
    let subcommands: Vec<&str> = subcommands.lines().collect();
    assert!(subcommands.contains(&"run") && subcommands.contains(&"drill"));
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout(gateway().args(["completions", shell]));
        for sub in &subcommands {
            assert!(script.contains(sub), "{shell}: {sub}");
        }
        assert!(script.contains("config"), "{shell}: the --config option");
    }
    let out = gateway().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "no such shell: a usage error");
}

/// The completion script for `shell`, in a file a shell can load.
fn completion_script(shell: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), stdout(gateway().args(["completions", shell]))).unwrap();
    file
}

/// What bash's completion offers for the words typed so far (the last one being completed),
/// as bash-completion calls the function the script registers: `COMP_WORDS`, `COMP_CWORD`,
/// and the command, the word and the word before as arguments.
fn bash_completes(script: &Path, words: &[&str]) -> Vec<String> {
    const DRIVE: &str = r#"
source "$1"; shift
spec=$(complete -p dedupe-gateway) || exit 1
f=${spec##* -F }; f=${f%% *}
COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))
COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
"$f" dedupe-gateway "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"#;
    let out = stdout(
        Command::new("bash")
            .args(["--norc", "-c", DRIVE, "bash"])
            .arg(script)
            .args(words),
    );
    out.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_completes_subcommands_flags_and_values_past_the_first_word() {
    let script = completion_script("bash");
    let script = script.path();
    let cases: [(&[&str], &[&str]); 5] = [
        (&["dedupe-gateway", "ke"], &["keys"]),
        (&["dedupe-gateway", "keys", "li"], &["list"]),
        (&["dedupe-gateway", "check", "--co"], &["--config"]),
        (&["dedupe-gateway", "keys", "list", "--st"], &["--state"]),
        (
            &["dedupe-gateway", "keys", "list", "--state", ""],
            &["held", "in-flight"],
        ),
    ];
    for (words, want) in cases {
        assert_eq!(bash_completes(script, words), want, "{words:?}");
    }
}

#[test]
fn fish_completes_subcommands_flags_and_values() {
    let script = completion_script("fish");
    let cases = [
        ("dedupe-gateway keys li", "list"),
        ("dedupe-gateway check --co", "--config"),
        ("dedupe-gateway keys list --state ", "held\nin-flight"),
    ];
    for (line, want) in cases {
        let out = stdout(Command::new("fish").args([
            "--no-config",
            "-c",
            &format!("source {}; complete -C '{line}'", script.path().display()),
        ]));
        // Each candidate, without fish's tab and description.
        let got: Vec<&str> = out.lines().map(|l| l.split('\t').next().unwrap()).collect();
        assert_eq!(got.join("\n"), want, "{line:?}");
    }
}

/// zsh completes only inside its line editor: an interactive `zsh -f` on a pseudo-terminal
/// (`zsh/zpty`), with compinit and the script on its `fpath`, is sent the line and a TAB,
/// then (once the terminal is quiet) a return. `dedupe-gateway` there is a function that
/// prints the words it ran with (`RAN:...:END`), so the terminal shows the line as
/// completed; a listing shows above it. Each wait is bounded (20 s), none is a fixed sleep.
fn zsh_completes(dir: &Path, line: &str) -> String {
    let drive = format!(
        r#"zmodload zsh/zpty
zpty -b z zsh -f -i
zpty -w z "PS1='> '; fpath=({dir} \$fpath); autoload -U compinit; compinit -u -D; setopt nobeep; dedupe-gateway() {{ print -r -- RAN:\$*:END }}; print -r -- READY\$((6*7))"
typeset all=""
# Reads into $all until it matches $1; with no pattern, until half a second passes quietly.
read_until() {{
  local out; integer waited=0 quiet=0
  while (( waited < 400 )); do
    if zpty -r -t z out; then
      all+=$out; quiet=0
      [[ -n $1 && $all == *$~1* ]] && return 0
    else
      [[ -z $1 ]] && (( quiet >= 10 )) && return 0
      sleep 0.05; (( waited++, quiet++ ))
    fi
  done
  print -r -- "timed out waiting for ${{1:-quiet}}: $all"; exit 1
}}
read_until 'READY42'
all=""
zpty -w -n z $'{line}\t'
read_until
zpty -w -n z $'\r'
read_until 'RAN:*:END'
print -r -- "$all"
zpty -d z
"#,
        dir = dir.display()
    );
    stdout(Command::new("zsh").args(["-f", "-c", &drive]))
}

#[test]
fn zsh_loads_the_script_and_completes_subcommands_flags_and_values() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("_dedupe-gateway"),
        stdout(gateway().args(["completions", "zsh"])),
    )
    .unwrap();
    // Loaded by compinit from fpath, as the package installs it: no error, and registered.
    let loaded = stdout(Command::new("zsh").args([
        "-f",
        "-c",
        &format!(
            "fpath=({} $fpath); autoload -U compinit; compinit -u -D; print -r -- $_comps[dedupe-gateway]",
            dir.path().display()
        ),
    ]));
    assert_eq!(loaded.trim(), "_dedupe-gateway");
    let cases = [
        ("dedupe-gateway keys li", &["RAN:keys list"][..]),
        ("dedupe-gateway check --co", &["RAN:check --config"]),
        ("dedupe-gateway keys list --state ", &["held", "in-flight"]),
    ];
    for (line, want) in cases {
        let shown = zsh_completes(dir.path(), line);
        for w in want {
            assert!(shown.contains(w), "{line:?}: {w} not offered in {shown:?}");
        }
    }
}

/// `scripts/demo` with `env`, stopped before it builds anything by the refusals this
/// checks: its exit status and what it said.
fn demo(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = Command::new("scripts/demo")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), said)
}

#[test]
fn the_demo_refuses_a_taken_port_naming_the_variable_that_chooses_another() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    for var in ["DEMO_PORT", "DEMO_ADMIN_PORT", "DEMO_UPSTREAM_PORT"] {
        let (code, said) = demo(&[(var, &port)]);
        assert_eq!(code, Some(69), "{var}: {said}");
        assert!(
            said.contains(&format!("127.0.0.1:{port} ({var}) is already in use"))
                && said.contains(&format!("set {var} to a free port")),
            "{var}: {said}"
        );
    }
    let (code, said) = demo(&[("DEMO_PORT", "80a")]);
    assert_eq!(code, Some(64), "{said}");
    assert!(said.contains("DEMO_PORT=80a is not a port"), "{said}");
}

#[test]
fn man_pages_are_roff_with_exit_statuses_and_environment() {
    let page = stdout(gateway().arg("man"));
    assert!(page.contains("\n.TH dedupe-gateway 1 "), "{page}");
    for section in [
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH \"EXIT STATUS\"",
        ".SH ENVIRONMENT",
        ".SH VERSION",
    ] {
        assert!(page.contains(section), "{section} missing:\n{page}");
    }
    assert!(page.contains("DEDUPE_REDIS_PASSWORD"), "{page}");
    // SEE ALSO names each subcommand's page.
    assert!(page.contains("dedupe\\-gateway\\-drill(1)"), "{page}");
    let run_page = stdout(gateway().args(["man", "run"]));
    assert!(
        run_page.contains("\n.TH dedupe-gateway-run 1 "),
        "{run_page}"
    );
    assert!(run_page.contains("DEDUPE_CONFIG"), "{run_page}");
    let out = gateway().args(["man", "nope"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("one of run, check, drill"));
}

// ---------------------------------------------------------------------------------------
// The Debian package
// ---------------------------------------------------------------------------------------

/// The package built once for every test here, and its files unpacked.
struct Package {
    deb: PathBuf,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

fn package() -> &'static Package {
    static PACKAGE: OnceLock<Package> = OnceLock::new();
    PACKAGE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        // The test build's binary (target/debug), packed as the release one would be.
        let bin = Path::new(env!("CARGO_BIN_EXE_dedupe-gateway"));
        let target = bin.parent().unwrap().parent().unwrap();
        let started = Instant::now();
        run(Command::new("scripts/deb")
            .args(["--profile", "dev", "--no-build", "--fast", "--output"])
            .arg(&out)
            .env("CARGO_TARGET_DIR", target));
        eprintln!("scripts/deb took {:?}", started.elapsed());
        let deb = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .expect("no .deb written");
        let root = dir.path().join("root");
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
        Package {
            deb,
            root,
            _dir: dir,
        }
    })
}

#[test]
fn the_package_carries_the_binary_unit_config_man_pages_and_completions() {
    let p = package();
    let listing = stdout(Command::new("dpkg-deb").arg("-c").arg(&p.deb));
    let mode_of = |path: &str| {
        listing
            .lines()
            .find(|l| l.ends_with(&format!(" .{path}")))
            .unwrap_or_else(|| panic!("{path} missing:\n{listing}"))
            .split(' ')
            .next()
            .unwrap()
            .to_owned()
    };
    for (path, mode) in [
        ("/usr/bin/dedupe-gateway", "-rwxr-xr-x"),
        (
            "/usr/lib/systemd/system/dedupe-gateway.service",
            "-rw-r--r--",
        ),
        ("/etc/dedupe-gateway/gateway.toml", "-rw-r--r--"),
        // It holds secrets.
        ("/etc/default/dedupe-gateway", "-rw-------"),
        ("/usr/share/man/man1/dedupe-gateway.1.gz", "-rw-r--r--"),
        (
            "/usr/share/bash-completion/completions/dedupe-gateway",
            "-rw-r--r--",
        ),
        (
            "/usr/share/zsh/vendor-completions/_dedupe-gateway",
            "-rw-r--r--",
        ),
        (
            "/usr/share/fish/vendor_completions.d/dedupe-gateway.fish",
            "-rw-r--r--",
        ),
        ("/usr/share/doc/dedupe-gateway/copyright", "-rw-r--r--"),
        (
            "/usr/share/dedupe-gateway/grafana/dedupe-gateway.json",
            "-rw-r--r--",
        ),
        (
            "/usr/share/dedupe-gateway/prometheus/dedupe-gateway.rules.yml",
            "-rw-r--r--",
        ),
    ] {
        assert_eq!(mode_of(path), mode, "{path}");
    }
    // A page for the binary and for each subcommand the main page names.
    let subcommands = stdout(gateway().args(["man", "--list"]));
    for sub in subcommands.lines() {
        mode_of(&format!("/usr/share/man/man1/dedupe-gateway-{sub}.1.gz"));
    }

    let info = stdout(Command::new("dpkg-deb").arg("-I").arg(&p.deb));
    for field in [
        "Package: dedupe-gateway",
        concat!("Version: ", env!("CARGO_PKG_VERSION"), "-1"),
        "Section: net",
        "Depends: libc6",
    ] {
        assert!(info.contains(field), "{field} missing:\n{info}");
    }
    let control = tempfile::tempdir().unwrap();
    run(Command::new("dpkg-deb")
        .arg("-e")
        .arg(&p.deb)
        .arg(control.path()));
    let read = |name: &str| std::fs::read_to_string(control.path().join(name)).unwrap();
    let conffiles = read("conffiles");
    assert!(
        conffiles.contains("/etc/dedupe-gateway/gateway.toml"),
        "{conffiles}"
    );
    assert!(
        conffiles.contains("/etc/default/dedupe-gateway"),
        "{conffiles}"
    );
    // Enabled and started on install, restarted on upgrade, stopped on removal.
    let postinst = read("postinst");
    assert!(
        postinst.contains("deb-systemd-helper enable dedupe-gateway.service"),
        "{postinst}"
    );
    assert!(
        postinst.contains("deb-systemd-invoke $_dh_action dedupe-gateway.service"),
        "{postinst}"
    );
    assert!(read("prerm").contains("deb-systemd-invoke stop dedupe-gateway.service"));

    // The packed copy is this build's, and it runs.
    let packed = p.root.join("usr/bin/dedupe-gateway");
    assert_eq!(
        stdout(Command::new(&packed).arg("--version")),
        stdout(gateway().arg("--version"))
    );
    // The man page decompresses to the page `dedupe-gateway man` prints.
    let mut page = String::new();
    let gz = std::fs::File::open(p.root.join("usr/share/man/man1/dedupe-gateway.1.gz")).unwrap();
    let mut gunzip = Command::new("gzip")
        .args(["-dc"])
        .stdin(gz)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    gunzip
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut page)
        .unwrap();
    assert!(gunzip.wait().unwrap().success());
    assert_eq!(page, stdout(gateway().arg("man")));
}

fn unit_text() -> String {
    std::fs::read_to_string(
        package()
            .root
            .join("usr/lib/systemd/system/dedupe-gateway.service"),
    )
    .unwrap()
}

#[test]
fn the_unit_is_hardened_and_reloads_with_sighup() {
    let unit = unit_text();
    for line in [
        "ExecStart=/usr/bin/dedupe-gateway run --config /etc/dedupe-gateway/gateway.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "SystemCallFilter=@system-service",
        "RestartPreventExitStatus=64",
        "LimitNOFILE=65536",
        "WantedBy=multi-user.target",
    ] {
        assert!(unit.lines().any(|l| l == line), "{line} missing:\n{unit}");
    }
    // The stop timeout outlasts the default drain.
    let stop: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .unwrap()
        .parse()
        .unwrap();
    let grace = dedupe_gateway::config::defaults::DEFAULT_SHUTDOWN_GRACE;
    assert!(Duration::from_secs(stop) > grace, "{stop}s vs {grace:?}");
}

/// `systemd-analyze`, when this machine has it.
fn systemd_analyze() -> Option<Command> {
    let found = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("systemd-analyze not found: the unit is not verified here");
    }
    found.then(|| Command::new("systemd-analyze"))
}

#[test]
fn systemd_analyze_verifies_the_unit_and_rates_it_safe() {
    let Some(_) = systemd_analyze() else { return };
    let p = package();
    // The unpacked package as the root the unit is read under: its ExecStart binary is
    // the packed one. What a Debian system adds: /bin/kill (ExecReload) and the targets.
    let root = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg("-a")
        .arg(p.root.join("."))
        .arg(root.path()));
    let units = root.path().join("usr/lib/systemd/system");
    for entry in std::fs::read_dir("/usr/lib/systemd/system").unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "target") {
            std::fs::copy(&path, units.join(path.file_name().unwrap())).unwrap();
        }
    }
    std::fs::copy("/usr/bin/kill", root.path().join("usr/bin/kill")).unwrap();
    std::os::unix::fs::symlink("usr/bin", root.path().join("bin")).unwrap();
    let out = systemd_analyze()
        .unwrap()
        .args(["verify", "--man=no"])
        .arg(format!("--root={}", root.path().display()))
        .arg("/usr/lib/systemd/system/dedupe-gateway.service")
        .output()
        .unwrap();
    // An unknown directive is only a message, so any message fails the test.
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.trim().is_empty(), "{said}");

    let out = systemd_analyze()
        .unwrap()
        .args(["security", "--offline=true", "--no-pager"])
        .arg(units.join("dedupe-gateway.service"))
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    let exposure: f64 = report
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for dedupe-gateway.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level:\n{report}"));
    assert!(
        exposure <= 2.0,
        "exposure {exposure} (0 safest, 10 unsafe):\n{report}"
    );
}

#[test]
fn the_packaged_binary_serves_the_packaged_config_as_the_unit_starts_it() {
    let p = package();
    let unit = unit_text();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap();
    // The unit's command line, its paths inside the unpacked package; the listeners on
    // ports of their own, through the variables /etc/default/dedupe-gateway would set.
    let mut args = exec.split(' ').map(|a| match a.strip_prefix('/') {
        Some(path) => p.root.join(path).into_os_string(),
        None => a.into(),
    });
    let mut child = Command::new(args.next().unwrap())
        .args(args)
        .args(["--log-format", "json"])
        .env("DEDUPE_LISTEN", "127.0.0.1:0")
        .env("DEDUPE_ADMIN_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its log lines, as they come, so that no wait here can hang.
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let logged = |what: &dyn Fn(&serde_json::Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if what(&v) {
                return Some(v);
            }
        }
        None
    };
    let Some(ready) = logged(&|v| v["message"] == "admin listener ready") else {
        let _ = child.kill();
        panic!("the packaged gateway did not start: {:?}", child.wait());
    };
    let admin = ready["addr"].as_str().unwrap().to_owned();
    let answer = http_get(&admin, "/readyz");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // What `systemctl reload` and `systemctl stop` send.
    signal(&child, "HUP");
    let reloaded = logged(&|v| v["message"] == "SIGHUP: configuration reloaded");
    assert!(reloaded.is_some(), "no reload logged after SIGHUP");
    signal(&child, "TERM");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

fn signal(child: &std::process::Child, sig: &str) {
    run(Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string()));
}

/// A GET over a fresh connection; the whole answer as text.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn the_packaged_config_passes_check_without_warnings() {
    let out = run(gateway()
        .args(["check", "--config"])
        .arg("deploy/debian/gateway.toml"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("warning"), "{text}");
    assert!(text.contains("listen 127.0.0.1:8080"), "{text}");
}

// ---------------------------------------------------------------------------------------
// The Dockerfile, the license, the changelog and what is stable
// ---------------------------------------------------------------------------------------

#[test]
fn the_dockerfile_copies_what_the_build_reads_and_names_known_variables() {
    let dockerfile = std::fs::read_to_string("docker/Dockerfile").unwrap();
    let copied: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .filter(|l| !l.starts_with("--from"))
        .flat_map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            parts[..parts.len() - 1].to_vec()
        })
        .collect();
    for needed in [
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "src",
        "benches",
        "tests/support",
        "examples",
    ] {
        assert!(
            copied.contains(&needed),
            "the build stage lacks {needed}: {copied:?}"
        );
    }
    // Its variables are the binary's, and the comment names every override.
    let help = stdout(gateway().arg("--help"));
    for var in dockerfile.split("DEDUPE_").skip(1).map(|rest| {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || *c == '_')
            .collect();
        format!("DEDUPE_{name}")
    }) {
        if var == "DEDUPE_BUILD_COMMIT" {
            continue; // the build's, read by build.rs
        }
        assert!(
            help.contains(&var),
            "{var} is not a variable the binary reads"
        );
    }
    for (var, _) in dedupe_gateway::config::ENV_OVERRIDES {
        assert!(
            dockerfile.contains(var),
            "the Dockerfile does not mention {var}"
        );
    }
    // `ENTRYPOINT ["dedupe-gateway"]` + `CMD ["run"]` runs on DEDUPE_CONFIG.
    assert!(dockerfile.contains("ENTRYPOINT [\"dedupe-gateway\"]"));
    assert!(dockerfile.contains("CMD [\"run\"]"));
    assert!(dockerfile.contains("ENV DEDUPE_CONFIG=/etc/dedupe-gateway/gateway.toml"));
    let run_help = stdout(gateway().args(["run", "--help"]));
    assert!(run_help.contains("[env: DEDUPE_CONFIG="), "{run_help}");
}

#[test]
fn the_license_file_is_the_one_cargo_toml_declares() {
    let manifest = std::fs::read_to_string("Cargo.toml").unwrap();
    assert!(manifest.contains("\nlicense = \"Apache-2.0\"\n"));
    let license = std::fs::read_to_string("LICENSE").unwrap();
    assert!(
        license.contains("Apache License\n                           Version 2.0, January 2004")
    );
    assert!(license.contains("END OF TERMS AND CONDITIONS"));
    assert!(license.contains("APPENDIX: How to apply the Apache License to your work."));
    assert_eq!(license.len(), 11358, "the standard text, unchanged");
}

#[test]
fn the_changelog_has_this_version() {
    let changelog = std::fs::read_to_string("CHANGELOG.md").unwrap();
    assert!(changelog.starts_with("# Changelog\n"));
    let heading = format!("\n## {}", env!("CARGO_PKG_VERSION"));
    assert!(changelog.contains(&heading), "no {heading:?} section");
}

/// The quoted strings of `text` that look like names: lower case, digits and `sep`.
fn names_in(text: &str, sep: char) -> Vec<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == sep)
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_stability_statement_names_every_metric_header_and_problem_type() {
    let doc = std::fs::read_to_string("docs/stability.md").unwrap();
    // Metrics: the names registered in src/telemetry/metrics/mod.rs (each through `Registering::add`).
    let metrics = std::fs::read_to_string("src/telemetry/metrics/mod.rs").unwrap();
    let registered: Vec<String> = metrics
        .split("reg.add(")
        .skip(1)
        .filter_map(|r| names_in(r, '_').into_iter().next())
        .collect();
    assert!(registered.len() >= 12, "{registered:?}");
    for name in registered {
        assert!(
            doc.contains(&format!("`dedupe_{name}")),
            "metric dedupe_{name}"
        );
    }
    // Headers: every name in src/protocol/headers.rs.
    let headers = std::fs::read_to_string("src/protocol/headers.rs").unwrap();
    let doc_lower = doc.to_ascii_lowercase();
    for h in headers.split("from_static(\"").skip(1) {
        let name = h.split('"').next().unwrap();
        assert!(doc_lower.contains(&format!("`{name}`")), "header {name}");
    }
    // Problem types: the names describe() gives in src/edge/problem/mod.rs.
    let problem = std::fs::read_to_string("src/edge/problem/mod.rs").unwrap();
    let describe = problem
        .split("fn describe(")
        .nth(1)
        .and_then(|r| r.split("\n    fn ").next())
        .unwrap();
    let types = names_in(describe, '-');
    assert!(types.len() > 20, "{types:?}");
    for t in types {
        assert!(doc.contains(&format!("`{t}`")), "problem type {t}");
    }
}
