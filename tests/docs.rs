//! The README and the book (docs/, an mdBook) hold together: every relative link and
//! `#anchor` in README.md and docs/*.md resolves, to a file that exists and, for an anchor,
//! to a heading of the target page (GitHub's and mdBook's slugs: lower case, spaces to `-`,
//! other punctuation dropped); and every page under docs/ is listed in docs/SUMMARY.md.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// The Markdown files checked, by path relative to the repository root.
type Pages = BTreeMap<PathBuf, String>;

/// The lines outside fenced code blocks (fences themselves dropped), with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        match fence {
            Some(f) if t.starts_with(f) => fence = None,
            Some(_) => {}
            None if t.starts_with("```") => fence = Some("```"),
            None if t.starts_with("~~~") => fence = Some("~~~"),
            None => out.push((n + 1, line)),
        }
    }
    out
}

/// A line with its inline code spans replaced by `code`: links are never read inside them.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => {
                out.push_str("code");
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(&rest[start..start + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The destinations of the inline links `[text](dest)` in one line (outside code).
fn links(line: &str) -> Vec<String> {
    let line = without_code(line);
    let bytes = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(off) = line[i..].find("](") {
        let start = i + off + 2;
        // The destination ends at the `)` that balances its `(`.
        let mut depth = 1;
        let mut end = start;
        while end < bytes.len() {
            match bytes[end] {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            end += 1;
        }
        if end >= bytes.len() {
            break;
        }
        // A title (`[t](dest "title")`) is not part of the destination.
        let dest = line[start..end].split_whitespace().next().unwrap_or("");
        out.push(dest.trim_matches(['<', '>']).to_owned());
        i = end;
    }
    out
}

/// GitHub's (and mdBook's) anchor for a heading's text.
fn slug(heading: &str) -> String {
    // Inline markup: links keep their text, code its content, emphasis nothing.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a page's headings give, duplicates numbered as GitHub numbers them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#').trim();
        let base = slug(title);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// `dir/../x/./y` as `x/y`, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// Every broken link in `pages`; `exists` says whether a path that is not a page exists.
fn broken_links(pages: &Pages, exists: impl Fn(&Path) -> bool) -> Vec<String> {
    let mut problems = Vec::new();
    for (page, text) in pages {
        for (n, line) in prose(text) {
            for dest in links(line) {
                if dest.contains("://") || dest.starts_with("mailto:") || dest.is_empty() {
                    continue;
                }
                let (file, anchor) = match dest.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (dest.as_str(), None),
                };
                let target = if file.is_empty() {
                    page.clone()
                } else {
                    normalise(&page.parent().unwrap_or(Path::new("")).join(file))
                };
                let at = format!("{}:{n}: ({dest})", page.display());
                let target_text = pages.get(&target);
                if target_text.is_none() && !exists(&target) {
                    problems.push(format!("{at}: {} does not exist", target.display()));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                match target_text {
                    Some(t) if anchors(t).contains(anchor) => {}
                    Some(_) => problems.push(format!(
                        "{at}: no heading in {} has the anchor #{anchor}",
                        target.display()
                    )),
                    None => problems.push(format!(
                        "{at}: #{anchor} points into {}, which is not a Markdown page",
                        target.display()
                    )),
                }
            }
        }
    }
    problems
}

/// Every page under docs/ that docs/SUMMARY.md does not list.
fn unlisted_pages(pages: &Pages) -> Vec<String> {
    let summary = &pages[Path::new("docs/SUMMARY.md")];
    let listed: BTreeSet<PathBuf> = prose(summary)
        .into_iter()
        .flat_map(|(_, line)| links(line))
        .map(|d| normalise(&Path::new("docs").join(d.split('#').next().unwrap_or(""))))
        .collect();
    pages
        .keys()
        .filter(|p| p.starts_with("docs") && p.as_path() != Path::new("docs/SUMMARY.md"))
        .filter(|p| !listed.contains(*p))
        .map(|p| format!("{} is not listed in docs/SUMMARY.md", p.display()))
        .collect()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every Markdown file under docs/.
fn repository_pages() -> Pages {
    fn walk(dir: &Path, rel: &Path, pages: &mut Pages) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let (path, rel) = (entry.path(), rel.join(entry.file_name()));
            if path.is_dir() {
                walk(&path, &rel, pages);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.insert(rel, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut pages = Pages::new();
    pages.insert(
        "README.md".into(),
        std::fs::read_to_string(root().join("README.md")).unwrap(),
    );
    walk(&root().join("docs"), Path::new("docs"), &mut pages);
    pages
}

#[test]
fn every_relative_link_and_anchor_in_the_readme_and_the_book_resolves() {
    let pages = repository_pages();
    assert!(
        pages.len() > 10,
        "the book has its pages: {:?}",
        pages.keys()
    );
    let problems = broken_links(&pages, |p| root().join(p).exists());
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let pages = repository_pages();
    let problems = unlisted_pages(&pages);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // mdBook finds SUMMARY.md in the book's `src`, which is docs/ itself.
    let book = std::fs::read_to_string(root().join("docs/book.toml")).unwrap();
    assert!(
        book.lines().any(|l| l.replace(' ', "") == "src=\".\""),
        "docs/book.toml sets src = \".\":\n{book}"
    );
}

/// The checks above can fail: a broken file, a broken anchor, a page missing from the
/// summary are each reported, and links inside code are not read.
#[test]
fn the_checks_report_what_is_broken() {
    let mut pages = Pages::new();
    pages.insert(
        "README.md".into(),
        "# Top\n\nSee [a](docs/a.md#signed-webhooks-verify), [b](docs/b.md), [x](#top), \
         [y](#nowhere), `[c](docs/c.md)`, [z](docs/a.md#two-2).\n\n```\n[d](docs/d.md)\n```\n"
            .into(),
    );
    pages.insert(
        "docs/a.md".into(),
        "# A\n\n## Signed webhooks (`verify`)\n\n## Two\n\n## Two\n\n[up](../README.md#top) \
         [bad](../README.md#a)\n"
            .into(),
    );
    pages.insert(
        "docs/SUMMARY.md".into(),
        "# Summary\n\n- [A](a.md)\n".into(),
    );
    pages.insert("docs/orphan.md".into(), "# Orphan\n".into());
    let problems = broken_links(&pages, |_| false);
    let expect = [
        "docs/b.md does not exist",
        "no heading in README.md has the anchor #nowhere",
        "no heading in docs/a.md has the anchor #two-2",
        "no heading in README.md has the anchor #a",
    ];
    for e in expect {
        assert!(
            problems.iter().any(|p| p.ends_with(e)),
            "{e:?} not reported in {problems:#?}"
        );
    }
    assert_eq!(problems.len(), expect.len(), "{problems:#?}");
    assert_eq!(anchors(&pages[Path::new("docs/a.md")]).len(), 4);
    assert!(anchors(&pages[Path::new("docs/a.md")]).contains("two-1"));
    assert_eq!(
        unlisted_pages(&pages),
        ["docs/orphan.md is not listed in docs/SUMMARY.md"]
    );
    assert_eq!(
        slug("Errors in the API's dialect"),
        "errors-in-the-apis-dialect"
    );
    assert_eq!(slug("Rolling out: shadow mode"), "rolling-out-shadow-mode");
    assert_eq!(
        slug("Try it (one command, no Redis)"),
        "try-it-one-command-no-redis"
    );
}

/// The worked configuration in the README's "Run it in front of your API" passes
/// `check --strict` (valid, and without a warning) with the secrets it names set.
#[test]
fn the_readmes_worked_configuration_passes_check_strict() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split("\n## Run it in front of your API\n")
        .nth(1)
        .expect("the README has a \"Run it in front of your API\" section");
    let toml = section
        .split("```toml\n")
        .nth(1)
        .and_then(|s| s.split("\n```").next())
        .expect("the section opens with a TOML block");
    assert!(toml.contains("[admin]") && toml.contains("token = \"env:DEDUPE_ADMIN_TOKEN\""));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.toml");
    std::fs::write(&file, toml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dedupe-gateway"))
        .args(["check", "--strict", "--config"])
        .arg(&file)
        .env("DEDUPE_ADMIN_TOKEN", "0123456789abcdef")
        .env("STRIPE_WEBHOOK_SECRET", "whsec_test")
        .env_remove("DEDUPE_CONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "check --strict on the README's configuration: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
