//! `--discovery-file`: workers listed in a file a deployment tool writes.
//!
//! The file is JSON (`[...]`, or `{"workers": [...]}` with an optional `version`, as in SMG's
//! manifest) or, when its name ends in `.toml`, TOML
//! (`[[workers]]` tables, or `workers = [...]`). Each entry is a worker URL or a worker spec
//! object with the fields `POST /workers` takes. It is reread when its size or modification time
//! changes (looked at once a second), on SIGHUP, and every `--discovery-check-interval-secs`.
//! A file that cannot be read or parsed changes nothing; the failure is logged once until the
//! file reads again. At startup, a missing file is waited for, and a broken one stops the start.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{Listing, Look, Source};
use crate::fleet::{Origin, WorkerSpec};

/// `--discovery-file` and how often it is reread regardless.
#[derive(Debug, Clone, PartialEq)]
pub struct FileConfig {
    pub path: PathBuf,
    pub every: Duration,
}

/// Why a listing file was not used.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: not valid TOML: {source}")]
    Toml {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("{path}: expected a list of workers, or a `workers` list")]
    Shape { path: PathBuf },
    #[error("{path}: worker {index}: {field}: {message}")]
    Worker {
        path: PathBuf,
        /// 1-based, in file order.
        index: usize,
        field: String,
        message: String,
    },
    #[error("{path}: {url} is listed twice")]
    Duplicate { path: PathBuf, url: String },
}

/// The workers `text` lists (`toml`: it is TOML, else JSON); `path` names it in errors.
pub fn parse_listing(path: &Path, text: &str, toml: bool) -> Result<Listing, ListingError> {
    let path_buf = || path.to_path_buf();
    let document: Value = if toml {
        let table: toml::Table = toml::from_str(text).map_err(|source| ListingError::Toml {
            path: path_buf(),
            source,
        })?;
        Value::Object(
            table
                .into_iter()
                .map(|(k, v)| (k, toml_to_json(v)))
                .collect(),
        )
    } else {
        serde_json::from_str(text).map_err(|source| ListingError::Json {
            path: path_buf(),
            source,
        })?
    };
    let entries = match document {
        Value::Array(entries) => entries,
        // SMG's manifest has a `version` beside its `workers`.
        Value::Object(mut object) if object.keys().all(|k| k == "workers" || k == "version") => {
            match object.remove("workers") {
                Some(Value::Array(entries)) => entries,
                _ => return Err(ListingError::Shape { path: path_buf() }),
            }
        }
        _ => return Err(ListingError::Shape { path: path_buf() }),
    };
    let mut listing = Listing::new();
    for (n, entry) in entries.into_iter().enumerate() {
        let object = match entry {
            Value::String(url) => serde_json::json!({ "url": url }),
            other => other,
        };
        // A `Value` always serialises; an empty body would be refused below, not lost.
        let body = serde_json::to_vec(&object).unwrap_or_default();
        let spec = WorkerSpec::parse(&body).map_err(|e| ListingError::Worker {
            path: path_buf(),
            index: n + 1,
            field: e.field,
            message: e.message,
        })?;
        let url = spec.url.clone();
        if listing.insert(url.clone(), spec).is_some() {
            return Err(ListingError::Duplicate {
                path: path_buf(),
                url,
            });
        }
    }
    Ok(listing)
}

/// A TOML value as JSON (datetimes as their text).
fn toml_to_json(value: toml::Value) -> Value {
    match value {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => Value::from(f),
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(items) => Value::Array(items.into_iter().map(toml_to_json).collect()),
        toml::Value::Table(table) => Value::Object(
            table
                .into_iter()
                .map(|(k, v)| (k, toml_to_json(v)))
                .collect(),
        ),
    }
}

/// What says the file may have changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    let meta = std::fs::metadata(path)?;
    Ok(Stamp {
        len: meta.len(),
        modified: meta.modified().ok(),
    })
}

/// The watched file.
pub struct FileSource {
    config: FileConfig,
    toml: bool,
    /// The file as last read (`None`: it could not be).
    seen: Option<Stamp>,
    next_reread: Instant,
}

impl FileSource {
    /// Reads the file once: a gateway started with a file it cannot use says so at once. A file
    /// not there yet is waited for (a deployment tool may write it after the gateway starts).
    pub(crate) fn open(config: FileConfig) -> Result<(Self, Option<Listing>), ListingError> {
        let toml = config
            .path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("toml"));
        let mut source = Self {
            toml,
            seen: None,
            next_reread: Instant::now() + config.every,
            config,
        };
        let path = source.config.path.display().to_string();
        match source.read() {
            Ok(listing) => {
                info!(%path, workers = listing.len(), "discovery file read");
                Ok((source, Some(listing)))
            }
            Err(ListingError::Read { source: e, .. })
                if e.kind() == std::io::ErrorKind::NotFound =>
            {
                warn!(%path, "discovery file not there yet: its workers are registered when it is written");
                Ok((source, None))
            }
            Err(e) => Err(e),
        }
    }

    fn read(&mut self) -> Result<Listing, ListingError> {
        let path = &self.config.path;
        let read = |source| ListingError::Read {
            path: path.clone(),
            source,
        };
        // Stamped before reading, so a write during the read is seen next time.
        let stamp = stamp(path).map_err(read)?;
        let text = std::fs::read_to_string(path).map_err(read)?;
        self.seen = Some(stamp);
        parse_listing(path, &text, self.toml)
    }
}

impl Source for FileSource {
    const ORIGIN: Origin = Origin::DiscoveryFile;

    fn target(&self) -> String {
        self.config.path.display().to_string()
    }

    async fn poll(&mut self, asked: bool) -> Look {
        let now = Instant::now();
        let due = now >= self.next_reread;
        let changed = stamp(&self.config.path).ok() != self.seen;
        if !(asked || due || changed) {
            return Look::Unchanged;
        }
        self.next_reread = now + self.config.every;
        match self.read() {
            Ok(listing) => {
                if changed || asked {
                    info!(path = %self.target(), workers = listing.len(), "discovery file read");
                }
                Look::Listed(listing)
            }
            Err(e) => Look::Failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Result<Listing, ListingError> {
        parse_listing(Path::new("workers.json"), text, false)
    }

    #[test]
    fn json_lists_urls_specs_or_a_workers_object() {
        let plain = json(
            r#"["http://10.0.0.1:8000", {"url": "http://10.0.0.2:8000", "labels": {"zone": "a"}}]"#,
        )
        .unwrap();
        assert_eq!(plain.len(), 2);
        assert_eq!(plain["http://10.0.0.2:8000"].labels["zone"], "a");
        let wrapped = json(r#"{"version": 1, "workers": ["http://10.0.0.1:8000"]}"#).unwrap();
        assert_eq!(wrapped.keys().collect::<Vec<_>>(), ["http://10.0.0.1:8000"]);
        assert!(
            json("[]").unwrap().is_empty(),
            "an empty fleet is a listing"
        );
    }

    #[test]
    fn toml_lists_worker_tables_or_urls() {
        let text = "[[workers]]\nurl = \"http://10.0.0.1:8000\"\nmodel_id = \"m\"\n\n[[workers]]\nurl = \"http://10.0.0.2:8000\"\n[workers.health]\ncheck_interval_secs = 5\n";
        let listing = parse_listing(Path::new("w.toml"), text, true).unwrap();
        assert_eq!(listing.len(), 2);
        assert_eq!(
            listing["http://10.0.0.2:8000"].health.check_interval_secs,
            Some(5.0)
        );
        let urls = parse_listing(Path::new("w.toml"), "workers = [\"http://a:1\"]", true).unwrap();
        assert_eq!(urls.len(), 1);
    }

    #[test]
    fn bad_listings_say_where() {
        let e = json(r#"["http://a:1", {"url": "http://b:1", "weight": 2}]"#).unwrap_err();
        assert!(
            matches!(&e, ListingError::Worker { index: 2, field, .. } if field == "weight"),
            "{e}"
        );
        let e = json(r#"["http://a:1", "ftp://b"]"#).unwrap_err();
        assert!(
            matches!(&e, ListingError::Worker { index: 2, field, .. } if field == "url"),
            "{e}"
        );
        let e = json(r#"["http://a:1/", "http://a:1"]"#).unwrap_err();
        assert!(matches!(e, ListingError::Duplicate { .. }), "{e}");
        assert!(matches!(
            json("{\"workers\": 3}"),
            Err(ListingError::Shape { .. })
        ));
        assert!(matches!(
            json("{\"hosts\": []}"),
            Err(ListingError::Shape { .. })
        ));
        assert!(matches!(
            json("[\"http://a:1\""),
            Err(ListingError::Json { .. })
        ));
        assert!(matches!(
            parse_listing(Path::new("w.toml"), "[[workers]\n", true),
            Err(ListingError::Toml { .. })
        ));
    }
}
