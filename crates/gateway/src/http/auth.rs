//! API keys: the data-plane keys clients send, and the admin key that guards worker changes.
//! Keys are compared in constant time (`subtle`), so response timing says nothing about how much
//! of a guess was right.

use axum::http::{header, HeaderMap};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use super::RequestError;

/// The gateway's keys.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    /// Empty: the OpenAI routes are open.
    pub client: Vec<String>,
    /// None: worker mutations are refused.
    pub admin: Option<String>,
    /// `--control-plane-api-keys` (SMG's): more admin keys, and read-only ones.
    pub control_plane: Vec<ControlPlaneKey>,
    /// Tenants' keys, each with the index of its tenant: a request sending one is that tenant's.
    pub(crate) tenants: Vec<(String, usize)>,
    /// `--admin-reads-open`: the admin API's reads need no key even when one guards its changes.
    pub reads_open: bool,
}

/// Who may call the gateway: the keys requests must carry, and the origins a browser may call
/// from. Built by its settings section (`config::AccessSettings`), taken whole at assembly.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub keys: Keys,
    /// `--cors-allowed-origins`; `None`: no cross-origin allowance.
    pub cors: Option<CorsOrigins>,
}

/// Which origins a browser may call the gateway from.
#[derive(Debug, Clone, PartialEq)]
pub enum CorsOrigins {
    Any,
    List(Vec<axum::http::HeaderValue>),
}

/// One control-plane key, as SMG writes it: `id:name:role:key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneKey {
    pub(crate) id: String,
    pub(crate) name: String,
    /// `admin` may change workers; `user` may only read the admin API.
    pub(crate) admin: bool,
    pub(crate) key: String,
}

/// Why a `--control-plane-api-keys` entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlPlaneKeyError {
    #[error("expected id:name:role:key")]
    Shape,
    #[error("role '{0}' is neither admin nor user")]
    Role(String),
    #[error("the id and the key cannot be empty")]
    Empty,
}

impl std::str::FromStr for ControlPlaneKey {
    type Err = ControlPlaneKeyError;

    /// `id:name:role:key`, role `admin` or `user`; the key may itself contain colons.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.splitn(4, ':');
        let (Some(id), Some(name), Some(role), Some(key)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(ControlPlaneKeyError::Shape);
        };
        let admin = match role {
            "admin" => true,
            "user" => false,
            other => return Err(ControlPlaneKeyError::Role(other.into())),
        };
        if id.is_empty() || key.is_empty() {
            return Err(ControlPlaneKeyError::Empty);
        }
        Ok(Self {
            id: id.into(),
            name: name.into(),
            admin,
            key: key.into(),
        })
    }
}

fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let prefix = b"Bearer ";
    (value.len() > prefix.len() && value[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &value[prefix.len()..])
}

/// Whether `given` equals any of `keys`, looking at every key whatever matches.
fn matches_any<'a>(keys: impl Iterator<Item = &'a String>, given: &[u8]) -> bool {
    keys.fold(subtle::Choice::from(0), |found, key| {
        found | key.as_bytes().ct_eq(given)
    })
    .into()
}

/// Whose key a request sent, for the routes clients call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOwner {
    /// No keys are configured, or an `--api-key` was sent: the default tenant's request.
    Anyone,
    /// A tenant's key: the tenant at this index of the configured ones.
    Tenant(usize),
}

impl Keys {
    /// Whether the request may use the OpenAI routes, and as whom. Every key is compared whatever
    /// matches, so timing tells neither which key nor which kind matched.
    pub(crate) fn check_client(&self, headers: &HeaderMap) -> Result<KeyOwner, RequestError> {
        if self.client.is_empty() && self.tenants.is_empty() {
            return Ok(KeyOwner::Anyone);
        }
        let Some(given) = bearer(headers) else {
            return Err(RequestError::InvalidApiKey);
        };
        let client = matches_any(self.client.iter(), given);
        let none = u64::MAX;
        let owner = self.tenants.iter().fold(none, |owner, (key, tenant)| {
            u64::conditional_select(&owner, &(*tenant as u64), key.as_bytes().ct_eq(given))
        });
        match (client, owner) {
            (true, _) => Ok(KeyOwner::Anyone),
            (false, o) if o != none => Ok(KeyOwner::Tenant(o as usize)),
            _ => Err(RequestError::InvalidApiKey),
        }
    }

    /// Whether any key guards the admin API (else changes are refused and reads are open).
    pub(crate) fn admin_configured(&self) -> bool {
        self.admin.is_some() || !self.control_plane.is_empty()
    }

    /// The keys that may change workers.
    fn admin_keys(&self) -> impl Iterator<Item = &String> {
        self.admin.iter().chain(
            self.control_plane
                .iter()
                .filter(|k| k.admin)
                .map(|k| &k.key),
        )
    }

    pub(crate) fn check_admin(&self, headers: &HeaderMap) -> Result<(), RequestError> {
        if !self.admin_configured() {
            return Err(RequestError::AdminDisabled);
        }
        match bearer(headers) {
            Some(given) if matches_any(self.admin_keys(), given) => Ok(()),
            _ => Err(RequestError::InvalidAdminKey),
        }
    }

    /// An admin key, or a read-only control-plane key.
    pub(crate) fn check_admin_read(&self, headers: &HeaderMap) -> Result<(), RequestError> {
        match bearer(headers) {
            Some(given) if self.is_admin_reader(given) => Ok(()),
            _ => Err(RequestError::InvalidAdminKey),
        }
    }

    /// Whether `given` is an admin key or a read-only control-plane key (the status page's
    /// login, whose key comes in a cookie rather than a header).
    pub(crate) fn is_admin_reader(&self, given: &[u8]) -> bool {
        let readers = self.control_plane.iter().map(|k| &k.key);
        matches_any(self.admin_keys().chain(readers), given)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_plane_keys_read_as_smg_writes_them() {
        let k: ControlPlaneKey = "key1:Service Account:admin:secret:123".parse().unwrap();
        assert_eq!(
            k,
            ControlPlaneKey {
                id: "key1".into(),
                name: "Service Account".into(),
                admin: true,
                key: "secret:123".into(),
            }
        );
        assert!(
            !"k2:Read Only:user:s"
                .parse::<ControlPlaneKey>()
                .unwrap()
                .admin
        );
        for (bad, why) in [
            ("k:n:root:s", ControlPlaneKeyError::Role("root".into())),
            ("k:n:admin", ControlPlaneKeyError::Shape),
            (":n:user:s", ControlPlaneKeyError::Empty),
        ] {
            assert_eq!(bad.parse::<ControlPlaneKey>(), Err(why), "{bad}");
        }
        let keys = Keys {
            control_plane: vec![
                "a:A:admin:adm".parse().unwrap(),
                "r:R:user:rdr".parse().unwrap(),
            ],
            ..Keys::default()
        };
        assert!(keys.check_admin(&auth("Bearer adm")).is_ok());
        assert_eq!(
            keys.check_admin(&auth("Bearer rdr")),
            Err(RequestError::InvalidAdminKey),
            "a user key cannot change workers"
        );
        assert!(keys.check_admin_read(&auth("Bearer rdr")).is_ok());
        assert!(keys.check_admin_read(&auth("Bearer adm")).is_ok());
        assert!(keys.check_admin_read(&auth("Bearer nope")).is_err());
    }
    use axum::http::HeaderValue;

    fn auth(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn client_keys() {
        let open = Keys::default();
        assert!(open.check_client(&HeaderMap::new()).is_ok());
        let keys = Keys {
            client: vec!["k1".into(), "k2".into()],
            tenants: vec![("t0".into(), 0), ("t1".into(), 1)],
            ..Keys::default()
        };
        assert_eq!(
            keys.check_client(&auth("Bearer t1")),
            Ok(KeyOwner::Tenant(1))
        );
        assert_eq!(keys.check_client(&auth("Bearer k1")), Ok(KeyOwner::Anyone));
        let only_tenants = Keys {
            tenants: vec![("t0".into(), 0)],
            ..Keys::default()
        };
        assert_eq!(
            only_tenants.check_client(&HeaderMap::new()),
            Err(RequestError::InvalidApiKey),
            "a tenant's key configured turns authentication on"
        );
        assert!(keys.check_client(&auth("Bearer k2")).is_ok());
        assert!(keys.check_client(&auth("bearer k1")).is_ok());
        for bad in ["Bearer k3", "Bearer ", "k1", "Basic k1", "Bearer k1 "] {
            assert_eq!(
                keys.check_client(&auth(bad)),
                Err(RequestError::InvalidApiKey),
                "{bad}"
            );
        }
        assert_eq!(
            keys.check_client(&HeaderMap::new()),
            Err(RequestError::InvalidApiKey)
        );
    }

    #[test]
    fn admin_key() {
        let none = Keys::default();
        assert_eq!(
            none.check_admin(&auth("Bearer x")),
            Err(RequestError::AdminDisabled)
        );
        let keys = Keys {
            admin: Some("root".into()),
            ..Keys::default()
        };
        assert!(keys.check_admin(&auth("Bearer root")).is_ok());
        assert_eq!(
            keys.check_admin(&auth("Bearer roo")),
            Err(RequestError::InvalidAdminKey)
        );
    }
}
