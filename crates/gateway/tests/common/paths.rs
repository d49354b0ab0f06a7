//! Reading a crate's sources for the layout tests: its files, its code without comments and
//! strings, and the paths it writes relative to itself (`crate::`, `super::`, `self::`).

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text with comments and string literals blanked (same length, so offsets hold).
pub fn code_of(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i < bytes.len() {
        let blank_to = |out: &mut Vec<u8>, from: usize, to: usize| {
            for b in &mut out[from..to] {
                if *b != b'\n' {
                    *b = b' ';
                }
            }
        };
        if bytes[i..].starts_with(b"//") {
            let end = bytes[i..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(bytes.len(), |n| i + n);
            blank_to(&mut out, i, end);
            i = end;
        } else if bytes[i] == b'"' && (i == 0 || bytes[i - 1] != b'\'') {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(bytes.len());
            blank_to(&mut out, i, end);
            i = end;
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

pub fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths after `at` (where `crate`, `super` or `self` starts): segments joined by `::`, and
/// a group `{a, b::{c}}` expanded into one path per item. Each with the offset it starts at.
pub fn path_tree(code: &str, at: usize, prefix: Vec<String>, out: &mut Vec<(usize, Vec<String>)>) {
    let mut segments = prefix;
    let at = at + (code[at..].len() - code[at..].trim_start().len());
    let mut i = at;
    loop {
        let rest = &code[i..];
        let trimmed = rest.trim_start();
        i += rest.len() - trimmed.len();
        if let Some(group) = trimmed.strip_prefix('{') {
            let mut depth = 0;
            let mut item = i + 1;
            for (k, c) in group.char_indices() {
                let end = match c {
                    '{' => {
                        depth += 1;
                        false
                    }
                    '}' if depth == 0 => true,
                    '}' => {
                        depth -= 1;
                        false
                    }
                    ',' => depth == 0,
                    _ => false,
                };
                if end {
                    path_tree(code, item, segments.clone(), out);
                    item = i + 1 + k + 1;
                    if c == '}' {
                        break;
                    }
                }
            }
            return;
        }
        let name: String = trimmed.chars().take_while(|&c| is_ident(c)).collect();
        if name.is_empty() {
            break;
        }
        segments.push(name.clone());
        i += name.len();
        if code[i..].starts_with("::") {
            i += 2;
        } else {
            break;
        }
    }
    if !segments.is_empty() {
        out.push((at, segments));
    }
}

/// Every path in `code` that starts with `crate`, `super` or `self`, groups expanded.
pub fn relative_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start).map(|i| i + from) {
            from = at + start.len();
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| is_ident(c) || c == ':' || c == '$') {
                continue;
            }
            path_tree(code, at, Vec::new(), &mut out);
        }
    }
    out
}
