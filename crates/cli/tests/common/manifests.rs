//! The deploy manifests as documents, and the check that a typed reading keeps every key: the
//! typed objects' deserialisers skip unknown keys, so a misspelt field would otherwise vanish
//! without a word.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// `deploy/{dir}`.
fn deploy_dir(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(dir)
}

/// Every document of every manifest in `deploy/{dir}`, with the file it came from.
pub fn documents(dir: &str) -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {:?}", deploy_dir(dir));
    files
        .into_iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            serde_saphyr::from_multiple::<Value>(&text)
                .unwrap_or_else(|e| panic!("{name}: not YAML: {e}"))
                .into_iter()
                .map(move |doc| (name.clone(), doc))
        })
        .collect()
}

/// The document read as `T` and written back.
pub fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// Where `original` and `back` differ, as paths (`spec.template.spec.containers[0].args`).
pub fn differences(original: &Value, back: &Value, at: &str, out: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let here = if at.is_empty() {
                    key.clone()
                } else {
                    format!("{at}.{key}")
                };
                match b.get(key) {
                    Some(other) => differences(value, other, &here, out),
                    None => out.push(format!("{here} (lost)")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(x, y, &format!("{at}[{i}]"), out);
            }
        }
        (a, b) if a != b => out.push(format!("{at}: {a} became {b}")),
        _ => {}
    }
}

/// `doc` read as `T` and written back, and every key it lost or value it changed.
pub fn lost_in<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<Vec<String>, String> {
    let back = round_trip::<T>(doc)?;
    let mut lost = Vec::new();
    differences(doc, &back, "", &mut lost);
    Ok(lost)
}

/// The document of `kind` named `name`.
pub fn find<'a>(docs: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    &docs
        .iter()
        .find(|(_, d)| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
        .1
}
