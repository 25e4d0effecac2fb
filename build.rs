//! Build metadata for `dedupe-gateway --version`: the commit and the build date.
//!
//! The commit is `DEDUPE_BUILD_COMMIT` when set (the Docker build, whose context has no
//! `.git`, passes it as a build argument), else `git rev-parse --short HEAD`, else
//! `unknown` (a source tarball, no git). The date is `SOURCE_DATE_EPOCH`'s when set, for
//! reproducible builds, else today's (UTC).

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    println!("cargo:rerun-if-env-changed=DEDUPE_BUILD_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    println!("cargo:rerun-if-changed=build.rs");
    // Run again when HEAD moves: on a checkout, a commit or a branch switch.
    for file in ["HEAD", "packed-refs"]
        .into_iter()
        .filter_map(|f| git(&["rev-parse", "--git-path", f]))
        .chain(
            git(&["symbolic-ref", "-q", "HEAD"])
                .and_then(|r| git(&["rev-parse", "--git-path", &r])),
        )
        .filter(|f| Path::new(f).exists())
    {
        println!("cargo:rerun-if-changed={file}");
    }

    let commit = std::env::var("DEDUPE_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=10", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    let seconds = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
    println!("cargo:rustc-env=DEDUPE_BUILD_COMMIT={commit}");
    println!("cargo:rustc-env=DEDUPE_BUILD_DATE={}", date(seconds));
}

/// A git command's trimmed output, or `None` without git, outside a checkout, or on an
/// error.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}

/// `YYYY-MM-DD` (UTC) of a Unix time, by the proleptic Gregorian calendar (Howard
/// Hinnant's `civil_from_days`): no date crate for one line of `--version`. Public for
/// the test that includes this file (tests/packaging.rs).
pub fn date(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
