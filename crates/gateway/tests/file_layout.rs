//! Within a folder, too, files import each other one way: in every crate of the workspace, no
//! two modules under one parent (`upstream/pool.rs` and `upstream/client.rs`, say) import each
//! other, directly or around a loop. Read from the paths the code writes: `crate::`, `super::`
//! and `self::` ones, in `use` lines (groups expanded) and in place, each resolved from the
//! module it is written in (an inline `mod tests { .. }` included) to the module it names.
//!
//! Why a test: `layout.rs` holds the crate's top-level folders to one direction, but a cycle
//! between two files of one folder is as invisible in review and makes neither file readable
//! alone. A failure prints every cycle with the lines that make it.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::graph::cycles;
use common::paths::{code_of, is_ident, relative_paths, rust_files};

/// A module as its path from the crate's root (`["upstream", "pool"]`).
type Module = Vec<String>;

/// One import between two sibling modules, and where it is written.
#[derive(Debug)]
struct Edge {
    parent: Module,
    from: String,
    to: String,
    file: PathBuf,
    line: usize,
}

/// The module a file is (`a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs`, `main.rs` the root).
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_string())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    let is_root = parts.is_empty() && matches!(stem, "lib" | "main");
    if stem != "mod" && !is_root {
        parts.push(stem.to_string());
    }
    parts
}

/// The inline modules of `code` (`mod name { .. }`): each one's name and the span of its body.
fn inline_modules(code: &str) -> Vec<(String, usize, usize)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("mod ").map(|i| i + from) {
        from = at + 4;
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let rest = &code[from..];
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|&c| is_ident(c))
            .collect();
        let after = rest.trim_start()[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = code.len() - after.len();
        let mut depth = 0;
        for (i, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        found.push((name.clone(), open, open + i));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    found
}

/// The module a path written in `module` names: its base resolved, then as many segments as
/// name modules that exist.
fn resolve(module: &Module, path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    let mut base = module.clone();
    let mut rest = path;
    match path.first()?.as_str() {
        "crate" => {
            base.clear();
            rest = &path[1..];
        }
        "self" => rest = &path[1..],
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    for segment in rest {
        let mut next = base.clone();
        next.push(segment.clone());
        if !modules.contains(&next) {
            break;
        }
        base = next;
    }
    Some(base)
}

/// The edges between siblings: an import from anywhere under one child of a module to anywhere
/// under another child of it.
fn sibling_edges(src: &Path) -> Vec<Edge> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let texts: Vec<(PathBuf, Module, String)> = files
        .iter()
        .map(|f| {
            let code = code_of(&std::fs::read_to_string(f).unwrap());
            (
                f.strip_prefix(src).unwrap().to_path_buf(),
                module_of(src, f),
                code,
            )
        })
        .collect();
    let mut modules: BTreeSet<Module> = texts.iter().map(|(_, m, _)| m.clone()).collect();
    for (_, module, code) in &texts {
        for (name, _, _) in inline_modules(code) {
            let mut inner = module.clone();
            inner.push(name);
            modules.insert(inner);
        }
    }
    let mut edges = Vec::new();
    for (file, module, code) in &texts {
        let inline = inline_modules(code);
        for (at, path) in relative_paths(code) {
            // Written inside inline modules: the path is read from the innermost one.
            let mut from = module.clone();
            for (name, open, close) in &inline {
                if *open < at && at < *close {
                    from.push(name.clone());
                }
            }
            let Some(to) = resolve(&from, &path, &modules) else {
                continue;
            };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue; // one contains the other: a module and its own parts
            }
            edges.push(Edge {
                parent: from[..common].to_vec(),
                from: from[common].clone(),
                to: to[common].clone(),
                file: file.clone(),
                line: code[..at].matches('\n').count() + 1,
            });
        }
    }
    edges
}

/// Every cycle among siblings, with the lines that make it.
fn report(edges: &[Edge]) -> String {
    let mut by_parent: BTreeMap<&Module, Vec<&Edge>> = BTreeMap::new();
    for e in edges {
        by_parent.entry(&e.parent).or_default().push(e);
    }
    let mut report = String::new();
    for (parent, edges) in by_parent {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for e in &edges {
            graph
                .entry(e.from.clone())
                .or_default()
                .insert(e.to.clone());
            graph.entry(e.to.clone()).or_default();
        }
        for component in cycles(&graph) {
            report.push_str(&format!(
                "\nin {}: cycle among {component:?}\n",
                parent.join("::")
            ));
            let lines: BTreeSet<String> = edges
                .iter()
                .filter(|e| component.contains(&e.from) && component.contains(&e.to))
                .map(|e| {
                    format!(
                        "  {} -> {}   ({}:{})\n",
                        e.from,
                        e.to,
                        e.file.display(),
                        e.line
                    )
                })
                .collect();
            report.extend(lines);
        }
    }
    report
}

#[test]
fn paths_are_read_from_where_they_are_written() {
    let code = code_of(
        "use super::{a::X, b::{c, d}};\n// use super::z;\nfn f() { crate::e::g(\"super::y\") }\n\
         mod tests { use super::*; use super::super::h; }\n",
    );
    let mut paths: Vec<String> = relative_paths(&code)
        .into_iter()
        .map(|(_, p)| p.join("::"))
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "crate::e::g",
            "super",
            "super::a::X",
            "super::b::c",
            "super::b::d",
            "super::super::h"
        ],
        "groups expanded; comments and strings skipped"
    );
    let inline = inline_modules(&code);
    assert_eq!(inline.len(), 1);
    assert_eq!(inline[0].0, "tests");
    let modules: BTreeSet<Module> = [
        vec!["m"],
        vec!["m", "f"],
        vec!["m", "f", "tests"],
        vec!["m", "h"],
    ]
    .into_iter()
    .map(|m| m.into_iter().map(String::from).collect())
    .collect();
    let here: Module = vec!["m".into(), "f".into()];
    let path = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
    assert_eq!(
        resolve(&here, &path("super::h::X"), &modules),
        Some(vec!["m".into(), "h".into()])
    );
    let in_tests: Module = vec!["m".into(), "f".into(), "tests".into()];
    assert_eq!(
        resolve(&in_tests, &path("super::super::h"), &modules),
        Some(vec!["m".into(), "h".into()])
    );
    assert_eq!(
        resolve(&in_tests, &path("super::Thing"), &modules),
        Some(here.clone())
    );
}

#[test]
fn the_checker_finds_a_cycle_between_two_files_of_one_folder() {
    let dir = std::env::temp_dir().join(format!("sluice-file-layout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\n").unwrap();
    std::fs::write(dir.join("a/mod.rs"), "mod x;\nmod y;\nmod z;\n").unwrap();
    std::fs::write(dir.join("a/x.rs"), "use super::y::Y;\n").unwrap();
    std::fs::write(dir.join("a/y.rs"), "use crate::a::{x::X, self};\n").unwrap();
    std::fs::write(dir.join("a/z.rs"), "mod tests { use super::super::y; }\n").unwrap();
    let found = report(&sibling_edges(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        found.contains("in a: cycle among [\"x\", \"y\"]"),
        "{found}"
    );
    assert!(!found.contains("\"z\""), "z only imports: {found}");
}

#[test]
fn no_two_files_under_one_folder_import_each_other_in_any_crate() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut report_all = String::new();
    let mut scanned = 0;
    for entry in std::fs::read_dir(&crates).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let edges = sibling_edges(&src);
        scanned += edges.len();
        let found = report(&edges);
        if !found.is_empty() {
            report_all.push_str(&format!("\n{}:{found}", src.display()));
        }
    }
    assert!(scanned > 100, "the scan found the imports ({scanned})");
    assert!(report_all.is_empty(), "{report_all}");
}

/// The longest a source file may be, tests included: past it, a file wants splitting along what
/// it does (the developers' guide). Functions are held under 60 lines by clippy
/// (`too_many_lines`, clippy.toml), test code excepted.
const MAX_FILE_LINES: usize = 600;

#[test]
fn no_source_file_of_any_crate_is_longer_than_600_lines() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        let dir = entry.unwrap().path();
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        }
    }
    assert!(
        files.len() > 300,
        "the scan found the sources ({})",
        files.len()
    );
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).unwrap().lines().count();
            (lines > MAX_FILE_LINES).then(|| format!("{} ({lines} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "over {MAX_FILE_LINES} lines: {long:#?}");
}
