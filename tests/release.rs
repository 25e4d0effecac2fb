//! `scripts/release`: the artefacts a release is made of, made here from the test build
//! (as tests/packaging.rs packs the Debian package) and taken apart: each is listed in
//! `SHA256SUMS` under its own SHA-256, the archive carries a binary that runs with its man
//! pages and completions, the source package carries no tests, benches or fixtures, and
//! the SBOM names the crates `Cargo.lock` pins.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

const VERSION: &str = env!("CARGO_PKG_VERSION");

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

/// The artefacts, made once for every test here.
struct Artefacts {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

fn artefacts() -> &'static Artefacts {
    static MADE: OnceLock<Artefacts> = OnceLock::new();
    MADE.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("release-artifacts");
        // The test build's binary (target/debug), packed as the release one would be.
        let bin = Path::new(env!("CARGO_BIN_EXE_dedupe-gateway"));
        let target = bin.parent().unwrap().parent().unwrap();
        run(Command::new("scripts/release")
            .args(["--profile", "dev", "--no-build", "--fast", "--out"])
            .arg(&dir)
            .env("CARGO_TARGET_DIR", target));
        Artefacts { dir, _tmp: tmp }
    })
}

/// `SHA256SUMS`: file name to hex digest.
fn sums() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(artefacts().dir.join("SHA256SUMS")).unwrap();
    text.lines()
        .map(|l| {
            let (sum, name) = l.split_once("  ").unwrap_or_else(|| panic!("{l:?}"));
            (name.to_owned(), sum.to_owned())
        })
        .collect()
}

fn triple() -> String {
    let out = run(Command::new("rustc").arg("-vV"));
    let text = String::from_utf8(out.stdout).unwrap();
    let host = text.lines().find_map(|l| l.strip_prefix("host: "));
    host.unwrap().to_owned()
}

fn tar_list(archive: &Path) -> Vec<String> {
    let out = run(Command::new("tar").arg("-tzf").arg(archive));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_artefact_is_listed_under_its_own_sha256() {
    let dir = &artefacts().dir;
    let sums = sums();
    let base = format!("dedupe-gateway-{VERSION}-{}", triple());
    let expected = [
        format!("{base}.tar.gz"),
        format!("dedupe-gateway-{VERSION}.crate"),
        format!("dedupe-gateway-{VERSION}.sbom.txt"),
        "RELEASE-NOTES.md".to_owned(),
    ];
    for name in &expected {
        assert!(
            sums.contains_key(name),
            "{name} not in SHA256SUMS: {sums:?}"
        );
    }
    let debs: Vec<&String> = sums.keys().filter(|n| n.ends_with(".deb")).collect();
    assert_eq!(debs.len(), 1, "{sums:?}");
    assert!(debs[0].starts_with(&format!("dedupe-gateway_{VERSION}-1_")));
    // Every file in the directory is summed, and every sum is the file's.
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "SHA256SUMS")
        .collect();
    files.sort();
    assert_eq!(files, sums.keys().cloned().collect::<Vec<_>>());
    for (name, sum) in &sums {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(hex::encode(Sha256::digest(&bytes)), *sum, "{name}");
    }
    run(Command::new("sha256sum")
        .args(["--quiet", "-c", "SHA256SUMS"])
        .current_dir(dir));
}

#[test]
fn the_archive_carries_a_binary_that_runs_with_its_man_pages_and_completions() {
    let base = format!("dedupe-gateway-{VERSION}-{}", triple());
    let archive = artefacts().dir.join(format!("{base}.tar.gz"));
    let listed = tar_list(&archive);
    for file in [
        "dedupe-gateway",
        "LICENSE",
        "README.md",
        "CHANGELOG.md",
        "man/dedupe-gateway.1.gz",
        "man/dedupe-gateway-run.1.gz",
        "completions/dedupe-gateway.bash",
        "completions/_dedupe-gateway",
        "completions/dedupe-gateway.fish",
    ] {
        let path = format!("{base}/{file}");
        assert!(listed.contains(&path), "{path} missing: {listed:?}");
    }
    let tmp = tempfile::tempdir().unwrap();
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(tmp.path()));
    let bin = tmp.path().join(&base).join("dedupe-gateway");
    let version = String::from_utf8(run(Command::new(&bin).arg("--version")).stdout).unwrap();
    assert!(
        version.starts_with(&format!("dedupe-gateway {VERSION} (commit ")),
        "{version}"
    );
    // The same binary as the one tested.
    let tested = std::fs::read(env!("CARGO_BIN_EXE_dedupe-gateway")).unwrap();
    assert!(
        std::fs::read(&bin).unwrap() == tested,
        "the archive's binary differs"
    );
}

#[test]
fn the_source_package_ships_no_tests_benches_or_fixtures() {
    let krate = artefacts()
        .dir
        .join(format!("dedupe-gateway-{VERSION}.crate"));
    let top = format!("dedupe-gateway-{VERSION}/");
    let listed: Vec<String> = tar_list(&krate)
        .into_iter()
        .map(|p| p.strip_prefix(&top).unwrap_or(&p).to_owned())
        .collect();
    for file in [
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "src/main.rs",
        "src/lib.rs",
        "LICENSE",
        "README.md",
        "config/example.toml",
        "docs/configuration.md",
    ] {
        assert!(
            listed.iter().any(|p| p == file),
            "{file} missing: {listed:?}"
        );
    }
    for path in &listed {
        for never in [
            "tests/",
            "benches/",
            "examples/",
            "docker/",
            ".ci/",
            "scripts/",
        ] {
            assert!(!path.starts_with(never), "the crate ships {path}");
        }
        assert!(!path.ends_with(".test.yml"), "the crate ships {path}");
    }
}

/// `Cargo.lock`'s packages: name to the versions pinned.
fn locked() -> BTreeMap<String, Vec<String>> {
    let lock = std::fs::read_to_string("Cargo.lock").unwrap();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = \"") {
            name = Some(n.trim_end_matches('"').to_owned());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = \""), name.take()) {
            out.entry(n)
                .or_default()
                .push(v.trim_end_matches('"').to_owned());
        }
    }
    out
}

#[test]
fn the_sbom_names_each_crate_at_the_version_cargo_lock_pins() {
    let path = artefacts()
        .dir
        .join(format!("dedupe-gateway-{VERSION}.sbom.txt"));
    let sbom = std::fs::read_to_string(path).unwrap();
    let locked = locked();
    let rows: Vec<Vec<&str>> = sbom
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(' ').collect())
        .collect();
    assert!(rows.len() > 100, "{sbom}");
    for row in &rows {
        let [name, version, .., source] = row[..] else {
            panic!("{row:?}")
        };
        let version = version
            .strip_prefix('v')
            .unwrap_or_else(|| panic!("{row:?}"));
        let pinned = locked
            .get(name)
            .unwrap_or_else(|| panic!("{name} not in Cargo.lock"));
        assert!(pinned.iter().any(|v| v == version), "{row:?}: {pinned:?}");
        assert!(["crates.io", "path"].contains(&source), "{row:?}");
        assert!(row.len() >= 4 && !row[2].is_empty(), "no license: {row:?}");
    }
    for needed in ["hyper", "tokio", "redis", "rustls", "dedupe-gateway"] {
        assert!(rows.iter().any(|r| r[0] == needed), "{needed} missing");
    }
    // Dev-dependencies are not in the binary.
    for dev in ["proptest", "rusqlite", "tempfile", "dedupe-test-support"] {
        assert!(!rows.iter().any(|r| r[0] == dev), "{dev} listed");
    }
}

#[test]
fn the_release_notes_are_the_changelog_section_of_this_version() {
    let notes = std::fs::read_to_string(artefacts().dir.join("RELEASE-NOTES.md")).unwrap();
    assert!(notes.starts_with(&format!("## {VERSION} ")), "{notes}");
    let changelog = std::fs::read_to_string("CHANGELOG.md").unwrap();
    assert!(changelog.contains(&notes), "not a section of CHANGELOG.md");
    assert!(
        !notes[3..].contains("\n## "),
        "more than one version's section"
    );
}

#[test]
fn a_tag_that_is_not_the_crate_version_is_refused_before_anything_is_built() {
    let out = Command::new("scripts/release")
        .args(["--tag", "v9.9.9", "--out"])
        .arg(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("version is {VERSION}")),
        "{stderr}"
    );
}
