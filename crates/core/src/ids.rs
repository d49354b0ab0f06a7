//! Names of things, as types, so a worker id cannot be passed where a model name is wanted.

use std::fmt;
use std::sync::Arc;

use serde::{Serialize, Serializer};

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn new(s: impl AsRef<str>) -> Self {
                Self(Arc::from(s.as_ref()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
    };
}

name_type!(
    /// A worker's id: opaque, stable for a URL, and safe to show to clients (unlike its URL).
    WorkerId
);
impl WorkerId {
    /// The id a worker at `url` gets: `w` and 8 hex digits of the URL's hash (`key_of`),
    /// stable across restarts and replicas, saying nothing of the URL. A registry that already
    /// holds it tells a second worker apart with a suffix.
    pub fn for_url(url: &str) -> Self {
        Self::new(format!(
            "w{:08x}",
            crate::policy::key_of(url.as_bytes()) as u32
        ))
    }
}

name_type!(
    /// A served model name, as clients put it in `model`.
    ModelName
);
name_type!(
    /// A tenant of the gateway: who is asking, for quotas and fairness.
    TenantId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_id_follows_from_its_url_alone() {
        let id = WorkerId::for_url("http://127.0.0.1:8001");
        assert_eq!(id, WorkerId::for_url("http://127.0.0.1:8001"));
        assert_ne!(id, WorkerId::for_url("http://127.0.0.1:8002"));
        assert_eq!(id.as_str().len(), 9);
        assert!(id.as_str().starts_with('w'));
        assert!(!id.as_str().contains("127.0.0.1"));
    }
}
