//! Flags and the `--config` file merged into one `Settings`: a flag given on the command line
//! (or through its environment variable) wins, then the file, then the flag's default. A key the
//! file has that no flag or table takes is refused with its line and column. With
//! `--smg-defaults`, SMG's default comes between the file and sluice's default.

use std::path::Path;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, FromArgMatches};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{smg_defaults, ConfigError, Settings};

/// Builds the settings from parsed command-line arguments and, if `--config` names one, a file;
/// with `--smg-defaults` (on the command line or in the file), SMG's defaults fill what neither
/// gives.
pub fn load(matches: &ArgMatches) -> Result<Settings, ConfigError> {
    let cli = command_line(matches)?;
    let file = file_of(&cli, matches)?;
    merge(cli, file, matches)
}

/// The gateway's settings and a command's own (`sluice epp`'s), each a flag over the file over
/// its default: a key of the file goes to whichever of the two takes it, so `sluice epp`'s file
/// is `sluice serve`'s with the picker's keys added.
pub fn load_with<T>(matches: &ArgMatches) -> Result<(Settings, T), ConfigError>
where
    T: Args + FromArgMatches + Serialize + DeserializeOwned,
{
    let cli = command_line(matches)?;
    let mut file = file_of(&cli, matches)?;
    let own_file: toml::Table = T::augment_args(clap::Command::new("own"))
        .get_arguments()
        .filter_map(|arg| {
            let key = arg.get_id().as_str();
            let value = file.remove(key)?;
            (!on_command_line(matches, key)).then(|| (key.to_string(), value))
        })
        .collect();
    let path = cli.config.clone();
    let settings = merge(cli, file, matches)?;
    let mut own = T::from_arg_matches(matches)?;
    if let (Some(path), false) = (path, own_file.is_empty()) {
        let mut table = toml::Table::try_from(&own)?;
        table.extend(own_file);
        own = T::deserialize(table).map_err(|source| ConfigError::File { path, source })?;
    }
    Ok((settings, own))
}

/// The settings the command line gives, defaults where it gives none.
fn command_line(matches: &ArgMatches) -> Result<Settings, ConfigError> {
    let mut cli = Settings::from_arg_matches(matches)?;
    if cli.health.no_remove_unhealthy_workers {
        // One field carries the choice, so --print-config shows it.
        cli.health.remove_unhealthy_workers = Some(false);
    }
    Ok(cli)
}

/// The `--config` file's table (empty without one).
fn file_of(cli: &Settings, matches: &ArgMatches) -> Result<toml::Table, ConfigError> {
    match &cli.config {
        Some(path) => read_file(path, matches),
        None => Ok(toml::Table::new()),
    }
}

/// The command line over the file over (with `--smg-defaults`) SMG's defaults over sluice's.
fn merge(cli: Settings, file: toml::Table, matches: &ArgMatches) -> Result<Settings, ConfigError> {
    let smg_defaults = cli.smg_defaults
        || (!on_command_line(matches, "smg_defaults")
            && file.get("smg_defaults") == Some(&toml::Value::Boolean(true)));
    if cli.config.is_none() && !smg_defaults {
        return Ok(cli);
    }
    let mut merged = toml::Table::try_from(&cli)?;
    let mut given: Vec<String> = Vec::new();
    for (key, value) in file {
        if !on_command_line(matches, &key) {
            given.push(key.clone());
            merged.insert(key, value);
        }
    }
    if smg_defaults {
        smg_defaults::fill(&mut merged, |key| {
            on_command_line(matches, key) || given.iter().any(|g| g == key)
        });
    }
    let mut settings = Settings::deserialize(merged).map_err(|source| match &cli.config {
        Some(path) => ConfigError::File {
            path: path.clone(),
            source,
        },
        None => ConfigError::Defaults(source),
    })?;
    settings.config = cli.config;
    settings.print_config = cli.print_config;
    settings.smg_defaults = smg_defaults;
    if cli.health.no_remove_unhealthy_workers {
        settings.health.remove_unhealthy_workers = Some(false);
    }
    Ok(settings)
}

/// Whether the flag whose id is `key` was given on the command line or through its environment
/// variable (a key no flag has was not).
fn on_command_line(matches: &ArgMatches, key: &str) -> bool {
    matches!(matches.try_get_raw(key), Ok(Some(_)))
        && matches!(
            matches.value_source(key),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
}

/// The config file's table, every key one a flag or a file-only table takes.
fn read_file(path: &Path, matches: &ArgMatches) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file: toml::Table = toml::from_str(&text).map_err(|source| ConfigError::File {
        path: path.to_path_buf(),
        source,
    })?;
    if let Some(key) = file.keys().find(|key| {
        COMMAND_LINE_ONLY.contains(&key.as_str())
            || (!FILE_ONLY_KEYS.contains(&key.as_str())
                && matches.try_get_raw(key.as_str()).is_err())
    }) {
        let (line, column) = position_of_key(&text, key);
        return Err(ConfigError::UnknownKey {
            path: path.to_path_buf(),
            key: key.clone(),
            line,
            column,
        });
    }
    Ok(file)
}

/// Settings only the config file can give (tables, not flags).
const FILE_ONLY_KEYS: [&str; 3] = ["tenants", "degradation", "cascade"];

/// Flags a config file cannot set: which file to read, what to do with it, and the negative
/// spelling of a switch whose key is the positive one (`remove_unhealthy_workers = false`).
pub const COMMAND_LINE_ONLY: [&str; 3] = ["config", "print_config", "no_remove_unhealthy_workers"];

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
