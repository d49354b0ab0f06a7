//! API keys: the data-plane keys clients send, and the admin key that guards worker changes.
//! Keys are compared in constant time (`subtle`), so response timing says nothing about how much
//! of a guess was right.

use axum::http::{header, HeaderMap};
use subtle::ConstantTimeEq;

use crate::error::GatewayError;

/// The gateway's keys.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    /// Empty: the OpenAI routes are open.
    pub client: Vec<String>,
    /// None: worker mutations are refused.
    pub admin: Option<String>,
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

impl Keys {
    pub fn check_client(&self, headers: &HeaderMap) -> Result<(), GatewayError> {
        if self.client.is_empty() {
            return Ok(());
        }
        match bearer(headers) {
            Some(given) if matches_any(self.client.iter(), given) => Ok(()),
            _ => Err(GatewayError::InvalidApiKey),
        }
    }

    pub fn check_admin(&self, headers: &HeaderMap) -> Result<(), GatewayError> {
        let Some(key) = &self.admin else {
            return Err(GatewayError::AdminDisabled);
        };
        match bearer(headers) {
            Some(given) if matches_any(std::iter::once(key), given) => Ok(()),
            _ => Err(GatewayError::InvalidAdminKey),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            admin: None,
        };
        assert!(keys.check_client(&auth("Bearer k2")).is_ok());
        assert!(keys.check_client(&auth("bearer k1")).is_ok());
        for bad in ["Bearer k3", "Bearer ", "k1", "Basic k1", "Bearer k1 "] {
            assert_eq!(
                keys.check_client(&auth(bad)),
                Err(GatewayError::InvalidApiKey),
                "{bad}"
            );
        }
        assert_eq!(
            keys.check_client(&HeaderMap::new()),
            Err(GatewayError::InvalidApiKey)
        );
    }

    #[test]
    fn admin_key() {
        let none = Keys::default();
        assert_eq!(
            none.check_admin(&auth("Bearer x")),
            Err(GatewayError::AdminDisabled)
        );
        let keys = Keys {
            client: vec![],
            admin: Some("root".into()),
        };
        assert!(keys.check_admin(&auth("Bearer root")).is_ok());
        assert_eq!(
            keys.check_admin(&auth("Bearer roo")),
            Err(GatewayError::InvalidAdminKey)
        );
    }
}
