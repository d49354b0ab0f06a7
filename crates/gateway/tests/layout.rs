//! The crate's folders import each other in one direction only: no cycle between the top-level
//! modules of `src/`, read from their `crate::` paths (`use` lines and paths written in place).
//! And the request path runs one way: front, admit, route, forward, stream, each taking the
//! hand-off of the one before by value, so a stage may name the stages before it and never one
//! after it — but for the front stage, which runs them all and which none names.
//!
//! Why a test: a cycle starts as one convenient `use` and is invisible in review; once two
//! folders need each other, neither can be understood, tested or moved alone. Run it alone with
//! `cargo test -p sluice-gateway --test layout`; a failure prints every cycle with the lines
//! that make it.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::graph::cycles;
use common::paths::{code_of, relative_paths, rust_files};

/// One edge of the graph: a file of folder `from` names `crate::<to>` on `line`.
#[derive(Debug, Clone)]
struct Import {
    from: String,
    to: String,
    file: PathBuf,
    line: usize,
}

/// The top-level module a file belongs to (`front/parse.rs` -> `front`), `None` for `lib.rs`.
fn folder_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if first == "lib.rs" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

/// Every `crate::name` in the code of `text` (comments and strings skipped), with its line. A
/// group (`use crate::{a, b::{c, d}}`, over several lines or one) names the first segment of
/// each item.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let code = code_of(text);
    let mut found: Vec<(usize, String)> = relative_paths(&code)
        .into_iter()
        .filter(|(_, path)| path.len() > 1 && path[0] == "crate")
        .map(|(at, path)| (code[..at].matches('\n').count() + 1, path[1].clone()))
        .collect();
    found.sort();
    found.dedup();
    found
}

fn imports(src: &Path) -> Vec<Import> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let folders: BTreeSet<String> = files.iter().filter_map(|f| folder_of(src, f)).collect();
    let mut edges = Vec::new();
    for file in &files {
        let Some(from) = folder_of(src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for (line, to) in crate_paths(&text) {
            if to != from && folders.contains(&to) {
                edges.push(Import {
                    from: from.clone(),
                    to,
                    file: file.strip_prefix(src).unwrap().to_path_buf(),
                    line,
                });
            }
        }
    }
    edges
}

fn graph_of(edges: &[Import]) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in edges {
        graph
            .entry(e.from.clone())
            .or_default()
            .insert(e.to.clone());
        graph.entry(e.to.clone()).or_default();
    }
    graph
}

#[test]
fn the_checker_finds_a_cycle_and_reads_grouped_imports() {
    let paths = crate_paths(
        "use crate::{a::X, b};\n// crate::c in a comment\npub(crate) fn f() { crate::d::g() }\n\
         use crate::{\n    e::{F, G},\n    h,\n};\n",
    );
    let named: Vec<(usize, &str)> = paths.iter().map(|(l, n)| (*l, n.as_str())).collect();
    assert_eq!(
        named,
        [(1, "a"), (1, "b"), (3, "d"), (5, "e"), (6, "h")],
        "names and lines, groups over several lines included"
    );
    let edge = |from: &str, to: &str| Import {
        from: from.into(),
        to: to.into(),
        file: PathBuf::new(),
        line: 0,
    };
    let acyclic = [edge("a", "b"), edge("b", "c"), edge("a", "c")];
    assert!(cycles(&graph_of(&acyclic)).is_empty());
    let cyclic = [
        edge("a", "b"),
        edge("b", "c"),
        edge("c", "a"),
        edge("c", "d"),
    ];
    assert_eq!(cycles(&graph_of(&cyclic)), vec![vec!["a", "b", "c"]]);
}

#[test]
fn no_folder_of_the_gateway_imports_one_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = imports(&src);
    assert!(edges.len() > 10, "the scan found the imports: {edges:?}");
    let found = cycles(&graph_of(&edges));
    let mut report = String::new();
    for component in &found {
        report.push_str(&format!("\ncycle among {component:?}:\n"));
        for e in edges
            .iter()
            .filter(|e| component.contains(&e.from) && component.contains(&e.to))
        {
            report.push_str(&format!(
                "  {} -> {}   ({}:{})\n",
                e.from,
                e.to,
                e.file.display(),
                e.line
            ));
        }
    }
    assert!(found.is_empty(), "{report}");
}

/// The request path's stages, in the order a request passes them.
const STAGES: [&str; 5] = ["front", "admit", "route", "forward", "stream"];

/// Imports against the request path's direction. A stage takes the hand-off of the one before it
/// by value (`Admitted`, `Placement`, `Answer`), so it may name the types of the stages before
/// it, never one after it; the front stage, which runs them all, is the one exception, and no
/// stage names it back.
fn backwards(edges: &[Import]) -> Vec<&Import> {
    let place = |folder: &str| STAGES.iter().position(|s| *s == folder);
    edges
        .iter()
        .filter(|e| match (e.from.as_str(), place(&e.from), place(&e.to)) {
            ("front", _, _) => false,
            (_, Some(_), Some(0)) => true,
            (_, Some(from), Some(to)) => to > from,
            _ => false,
        })
        .collect()
}

#[test]
fn the_direction_checker_finds_a_stage_naming_a_later_one_or_the_front() {
    let edge = |from: &str, to: &str| Import {
        from: from.into(),
        to: to.into(),
        file: PathBuf::new(),
        line: 0,
    };
    let edges = [
        edge("front", "admit"),
        edge("front", "stream"),
        edge("route", "admit"),
        edge("stream", "forward"),
        edge("stream", "fleet"),
        edge("admit", "route"),
        edge("forward", "stream"),
        edge("config", "front"),
        edge("stream", "front"),
    ];
    // `config` is no stage: it builds them all.
    let found: Vec<(&str, &str)> = backwards(&edges)
        .iter()
        .map(|e| (e.from.as_str(), e.to.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("admit", "route"),
            ("forward", "stream"),
            ("stream", "front")
        ]
    );
}

#[test]
fn the_request_path_imports_run_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = imports(&src);
    for stage in STAGES {
        assert!(
            src.join(stage).is_dir(),
            "{stage}/ is a folder of the crate"
        );
    }
    let report: Vec<String> = backwards(&edges)
        .iter()
        .map(|e| format!("{} -> {} ({}:{})", e.from, e.to, e.file.display(), e.line))
        .collect();
    assert!(report.is_empty(), "against the request path: {report:#?}");
}
