//! Checks of single values, each naming the setting it is about.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use super::ConfigError;

pub(super) fn invalid(setting: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        setting,
        message: message.into(),
    }
}

pub(super) fn parse_host(setting: &'static str, host: &str) -> Result<IpAddr, ConfigError> {
    if host == "localhost" {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    host.parse()
        .map_err(|_| invalid(setting, format!("'{host}' is not an IP address")))
}

pub(super) fn seconds(setting: &'static str, secs: f64) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(secs)
        .map_err(|_| invalid(setting, format!("{secs} is not a number of seconds >= 0")))
}

pub(super) fn positive_seconds(setting: &'static str, secs: f64) -> Result<Duration, ConfigError> {
    match seconds(setting, secs)? {
        d if d.is_zero() => Err(invalid(setting, "must be greater than 0")),
        d => Ok(d),
    }
}

pub(super) fn positive_count<T: PartialEq + From<u8>>(
    setting: &'static str,
    n: T,
) -> Result<T, ConfigError> {
    if n == T::from(0) {
        return Err(invalid(setting, "must be at least 1"));
    }
    Ok(n)
}

pub(super) fn fraction(setting: &'static str, x: f64) -> Result<f64, ConfigError> {
    if !(0.0..=1.0).contains(&x) {
        return Err(invalid(setting, format!("{x} is not between 0 and 1")));
    }
    Ok(x)
}

pub(super) fn at_least(setting: &'static str, x: f64, min: f64) -> Result<f64, ConfigError> {
    if !x.is_finite() || x < min {
        return Err(invalid(setting, format!("{x} must be at least {min}")));
    }
    Ok(x)
}

pub(super) fn non_empty_keys(
    setting: &'static str,
    keys: &[String],
) -> Result<Vec<String>, ConfigError> {
    if keys.iter().any(|k| k.trim().is_empty()) {
        return Err(invalid(setting, "a key cannot be empty"));
    }
    Ok(keys.to_vec())
}
