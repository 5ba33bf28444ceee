//! The library's layering, checked on the source: no two files inside `src/crypt/` or
//! `src/cli/` import each other, the library does not depend on the CLI or the benchmarks, and
//! the data path (crypt, verity, integrity, block, hash) does not depend on the exports built
//! on it.
//!
//! An import is a `crate::`, `super::` or `self::` path anywhere in a file outside its
//! `#[cfg(test)] mod tests { .. }` block (comments and doc links included: a doc link names a
//! dependency too), grouped `crate::a::{b, c}` uses counted per member, resolved to the
//! deepest file the path names. The rules are those of the lead's `circles.py`, so the two
//! agree on what a circle is. A parent `mod.rs` declaring its children (`mod x;`, `pub use
//! x::Y;`) is not an import; a child using its parent is one, and a circle only when the parent
//! uses the child back through a `crate::`/`super::`/`self::` path.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path from the crate root: `["crypt", "cipher", "xts"]`.
type ModPath = Vec<String>;

/// Every `.rs` file under `src/`, by the module path its location gives it.
fn source_files() -> BTreeMap<ModPath, PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.insert(module_path(&root, &path), path);
            }
        }
    }
    files
}

/// `src/crypt/cipher/xts.rs` is `crypt::cipher::xts`; `src/crypt/cipher/mod.rs` is
/// `crypt::cipher`.
fn module_path(root: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: ModPath = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The file's text without its inline unit tests (`#[cfg(test)] mod tests {` to the end of
/// the file): a test may reach anywhere.
fn without_tests(src: &str) -> &str {
    let mut from = 0;
    while let Some(at) = src[from..].find("#[cfg(test)]") {
        let start = from + at;
        let rest = src[start + "#[cfg(test)]".len()..].trim_start();
        if let Some(rest) = rest.strip_prefix("mod tests") {
            if rest.trim_start().starts_with('{') {
                return &src[..start];
            }
        }
        from = start + 1;
    }
    src
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Length of the identifier (`\w+`) at the start of `s`.
fn word_len(s: &str) -> usize {
    s.char_indices()
        .find(|&(_, c)| !is_word(c))
        .map_or(s.len(), |(i, _)| i)
}

/// Length of `(::\w+)*` at the start of `s`, greedy.
fn segments_len(s: &str) -> usize {
    let mut n = 0;
    while let Some(rest) = s[n..].strip_prefix("::") {
        let w = word_len(rest);
        if w == 0 {
            break;
        }
        n += 2 + w;
    }
    n
}

/// Whether `at` starts a word in `src` (`\b` before a word character).
fn word_starts(src: &str, at: usize) -> bool {
    !src[..at].chars().next_back().is_some_and(is_word)
}

/// The keyword (`crate`, `super`, or with `with_self` also `self`) starting at `at`, if any.
fn keyword_at(src: &str, at: usize, with_self: bool) -> Option<&'static str> {
    let keywords: &[&'static str] = if with_self {
        &["crate", "super", "self"]
    } else {
        &["crate", "super"]
    };
    let k = keywords.iter().find(|k| src[at..].starts_with(**k))?;
    word_starts(src, at).then_some(*k)
}

/// Every path the file names: `crate|super|self` followed by `::ident` segments, and each
/// member of a grouped `crate|super(::ident)*::{a, b::c, d as e}` (its first segment).
fn named_paths(src: &str) -> Vec<String> {
    let mut paths = Vec::new();
    // Plain paths: `\b(crate|super|self)(::\w+)+`, non-overlapping, left to right.
    let mut at = 0;
    while at < src.len() {
        if let Some(k) = keyword_at(src, at, true) {
            let n = segments_len(&src[at + k.len()..]);
            if n > 0 {
                paths.push(src[at..at + k.len() + n].to_string());
                at += k.len() + n;
                continue;
            }
        }
        at += src[at..].chars().next().unwrap().len_utf8();
    }
    // Grouped uses: `\b(crate|super)(::\w+)*::\{([^}]*)\}`.
    let mut at = 0;
    while at < src.len() {
        if let Some(k) = keyword_at(src, at, false) {
            let base_end = at + k.len() + segments_len(&src[at + k.len()..]);
            if let Some(group) = src[base_end..].strip_prefix("::{") {
                if let Some(close) = group.find('}') {
                    let base = &src[at..base_end];
                    for member in group[..close].split(',') {
                        let member = member.trim();
                        let member = member.split(" as ").next().unwrap();
                        let member = member.split("::{").next().unwrap();
                        if !member.is_empty() && member != "self" {
                            paths.push(format!("{base}::{member}"));
                        }
                    }
                    at = base_end + "::{".len() + close + 1;
                    continue;
                }
            }
        }
        at += src[at..].chars().next().unwrap().len_utf8();
    }
    paths
}

/// The deepest file a path names, seen from the file of module `cur`; `None` for a path that
/// is not relative to this crate.
fn resolve(files: &BTreeMap<ModPath, PathBuf>, cur: &ModPath, path: &str) -> Option<ModPath> {
    let mut parts: Vec<&str> = path.split("::").collect();
    let mut base: ModPath = match parts[0] {
        "crate" => Vec::new(),
        "super" => cur[..cur.len().saturating_sub(1)].to_vec(),
        "self" => cur.clone(),
        _ => return None,
    };
    parts.remove(0);
    if path.starts_with("super") {
        while parts.first() == Some(&"super") {
            base.pop();
            parts.remove(0);
        }
    }
    let mut best = None;
    for i in 0..=parts.len() {
        let mut candidate = base.clone();
        candidate.extend(parts[..i].iter().map(|p| p.to_string()));
        if files.contains_key(&candidate) {
            best = Some(candidate);
        }
    }
    best
}

/// Every (importer, imported) pair of distinct files under `src/`.
fn imports() -> BTreeSet<(ModPath, ModPath)> {
    let files = source_files();
    let mut edges = BTreeSet::new();
    for (module, file) in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for path in named_paths(without_tests(&text)) {
            if let Some(target) = resolve(&files, module, &path) {
                if &target != module {
                    edges.insert((module.clone(), target));
                }
            }
        }
    }
    edges
}

/// `crypt/cipher/xts`.
fn show(m: &ModPath) -> String {
    m.join("/")
}

/// The pairs of files in the same top-level module among `tops` that import each other.
fn circles(tops: &[&str]) -> Vec<String> {
    let edges = imports();
    edges
        .iter()
        .filter(|(a, b)| a < b && a[0] == b[0] && tops.contains(&a[0].as_str()))
        .filter(|(a, b)| edges.contains(&(b.clone(), a.clone())))
        .map(|(a, b)| format!("{} <-> {}", show(a), show(b)))
        .collect()
}

/// The imports from files under `from` into files under `into` (top-level module names).
fn imports_across(from: impl Fn(&str) -> bool, into: &[&str]) -> Vec<String> {
    imports()
        .into_iter()
        .filter(|(a, b)| from(&a[0]) && into.contains(&b[0].as_str()))
        .map(|(a, b)| format!("{} uses {}", show(&a), show(&b)))
        .collect()
}

#[test]
fn no_file_in_crypt_or_cli_imports_one_that_imports_it_back() {
    let found = circles(&["crypt", "cli"]);
    assert!(
        found.is_empty(),
        "files that import each other:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_cipher_and_target_rooms_have_no_circles() {
    // Already true (issue 22): kept true while the rest of crypt/ is still being untangled.
    let found: Vec<String> = circles(&["crypt"])
        .into_iter()
        .filter(|p| {
            p.split(" <-> ")
                .all(|f| f.starts_with("crypt/cipher") || f.starts_with("crypt/target"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "files that import each other:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_library_does_not_use_the_cli_or_the_benchmarks() {
    // main.rs is the binary, the CLI's own entry point.
    let found = imports_across(
        |top| !matches!(top, "cli" | "bench" | "main"),
        &["cli", "bench"],
    );
    assert!(
        found.is_empty(),
        "library files that import the CLI or the benchmarks:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_data_path_does_not_use_the_exports() {
    let found = imports_across(
        |top| matches!(top, "crypt" | "verity" | "integrity" | "block" | "hash"),
        &["export"],
    );
    assert!(
        found.is_empty(),
        "data-path files that import the exports (FUSE, NBD) built on them:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_finds_what_it_looks_for() {
    // The rules themselves, on made-up sources: a checker that finds nothing proves nothing.
    let src = "use super::iv::IvGen;\nuse crate::crypt::{cipher::{A, B}, target as t, self};\n\
               x = self::y::z; crates::no; a.self_::no;\nuse super::{xts as x, self};\n#[cfg(test)]\nmod tests {\n use crate::cli::X;\n}\n";
    let paths = named_paths(without_tests(src));
    assert_eq!(
        paths,
        [
            "super::iv::IvGen",
            "crate::crypt",
            "self::y::z",
            // Only up to the first `}`, as circles.py reads a group.
            "crate::crypt::cipher",
            "crate::crypt::B",
            "super::xts",
        ]
    );
    let files: BTreeMap<ModPath, PathBuf> = [
        vec!["crypt"],
        vec!["crypt", "cipher"],
        vec!["crypt", "cipher", "iv"],
        vec!["crypt", "cipher", "xts"],
    ]
    .into_iter()
    .map(|m| (m.into_iter().map(String::from).collect(), PathBuf::new()))
    .collect();
    let xts: ModPath = vec!["crypt".into(), "cipher".into(), "xts".into()];
    let at = |p: &str| resolve(&files, &xts, p).map(|m| show(&m));
    assert_eq!(at("super::iv::IvGen").as_deref(), Some("crypt/cipher/iv"));
    assert_eq!(at("super::super::cipher").as_deref(), Some("crypt/cipher"));
    assert_eq!(at("crate::crypt::secret::X").as_deref(), Some("crypt"));
    assert_eq!(at("self::inner").as_deref(), Some("crypt/cipher/xts"));
    assert_eq!(at("std::fmt"), None);
}
