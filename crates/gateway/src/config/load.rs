//! Flags and the `--config` file merged into one `Settings`: a flag given on the command line
//! (or through its environment variable) wins, then the file, then the flag's default. A key the
//! file has that no flag or table takes is refused with its line and column.

use clap::parser::ValueSource;
use clap::{ArgMatches, FromArgMatches};
use serde::Deserialize;

use super::{ConfigError, Settings};

/// Builds the settings from parsed command-line arguments and, if `--config` names one, a file.
pub fn load(matches: &ArgMatches) -> Result<Settings, ConfigError> {
    let mut cli = Settings::from_arg_matches(matches)?;
    if cli.no_remove_unhealthy_workers {
        // One field carries the choice, so --print-config shows it.
        cli.remove_unhealthy_workers = Some(false);
    }
    let Some(path) = cli.config.clone() else {
        return Ok(cli);
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    let file: toml::Table = toml::from_str(&text).map_err(|source| ConfigError::File {
        path: path.clone(),
        source,
    })?;
    if let Some(key) = file.keys().find(|key| {
        !FILE_ONLY_KEYS.contains(&key.as_str()) && matches.try_get_raw(key.as_str()).is_err()
    }) {
        let (line, column) = position_of_key(&text, key);
        return Err(ConfigError::UnknownKey {
            path,
            key: key.clone(),
            line,
            column,
        });
    }
    let mut merged = toml::Table::try_from(&cli)?;
    for (key, value) in file {
        // Unknown keys are left to `deny_unknown_fields` below, which names them.
        let known = matches!(matches.try_get_raw(&key), Ok(Some(_)));
        let from_cli = known
            && matches!(
                matches.value_source(&key),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            );
        if !from_cli {
            merged.insert(key, value);
        }
    }
    let mut settings =
        Settings::deserialize(merged).map_err(|source| ConfigError::File { path, source })?;
    settings.config = cli.config;
    settings.print_config = cli.print_config;
    if cli.no_remove_unhealthy_workers {
        settings.remove_unhealthy_workers = Some(false);
    }
    Ok(settings)
}

/// Settings only the config file can give (tables, not flags).
const FILE_ONLY_KEYS: [&str; 3] = ["tenants", "degradation", "cascade"];

/// Where `key = ...` stands in a TOML text, 1-based (line 1, column 1 if it is not found).
fn position_of_key(text: &str, key: &str) -> (usize, usize) {
    text.lines()
        .enumerate()
        .find_map(|(n, line)| {
            let indent = line.len() - line.trim_start().len();
            let rest = line.trim_start().strip_prefix(key)?;
            rest.trim_start()
                .starts_with('=')
                .then_some((n + 1, indent + 1))
        })
        .unwrap_or((1, 1))
}
