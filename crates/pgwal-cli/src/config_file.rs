//! `--config FILE`: a TOML file whose keys are the command's long options.
//!
//! The file is turned into command-line arguments placed before the ones
//! actually given, and clap parses both: the file gets exactly the
//! validation and error messages of the command line, and an option given
//! on the command line overrides the file's (a repeatable one, such as
//! `--publication`, adds to the file's). Keys are option names with `_`
//! or `-` (`status_interval` or `status-interval`); a string or number is
//! the value, `true` sets a flag (`false` leaves it unset), an array repeats
//! the option (`publication = ["a", "b"]`). `dbname` is the connection string.

use std::ffi::OsString;
use std::path::Path;

/// Why a configuration file was not used.
#[derive(Debug)]
pub(crate) enum ConfigFileError {
    /// It could not be read.
    Read(std::path::PathBuf, std::io::Error),
    /// It is not TOML, or holds a value no option takes.
    Invalid(std::path::PathBuf, String),
    /// `--config` without a file name.
    Missing,
}

impl std::fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigFileError::Read(p, e) => {
                write!(f, "cannot read config file {}: {e}", p.display())
            }
            ConfigFileError::Invalid(p, why) => write!(f, "config file {}: {why}", p.display()),
            ConfigFileError::Missing => write!(f, "--config needs a file name"),
        }
    }
}

impl std::error::Error for ConfigFileError {}

/// The arguments of `file`, as `--key value` pairs.
pub(crate) fn arguments(file: &Path) -> Result<Vec<OsString>, ConfigFileError> {
    let text =
        std::fs::read_to_string(file).map_err(|e| ConfigFileError::Read(file.to_owned(), e))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigFileError::Invalid(file.to_owned(), e.to_string()))?;
    let mut out = Vec::new();
    for (key, value) in table {
        let flag = format!("--{}", key.replace('_', "-"));
        let values = match value {
            toml::Value::Array(a) => a,
            v => vec![v],
        };
        for v in values {
            match v {
                toml::Value::Boolean(true) => out.push(flag.clone().into()),
                toml::Value::Boolean(false) => {}
                toml::Value::String(s) => {
                    out.push(flag.clone().into());
                    out.push(s.into());
                }
                toml::Value::Integer(i) => {
                    out.push(flag.clone().into());
                    out.push(i.to_string().into());
                }
                toml::Value::Float(x) => {
                    out.push(flag.clone().into());
                    out.push(x.to_string().into());
                }
                other => {
                    return Err(ConfigFileError::Invalid(
                        file.to_owned(),
                        format!("{key}: a {} is no option value", other.type_str()),
                    ))
                }
            }
        }
    }
    Ok(out)
}

const SUBCOMMANDS: &[&str] = &["stream", "receive", "slot"];

/// The process arguments with `--config FILE` (anywhere after the
/// subcommand) replaced by the file's arguments, inserted right after the
/// subcommand (or subcommands: `slot list`) so that options given on the
/// command line come later and win.
pub(crate) fn expand(args: Vec<OsString>) -> Result<Vec<OsString>, ConfigFileError> {
    let Some(i) = args
        .iter()
        .position(|a| a == "--config" || a.to_string_lossy().starts_with("--config="))
    else {
        return Ok(args);
    };
    let mut args = args;
    let arg = args.remove(i);
    let file = match arg.to_string_lossy().strip_prefix("--config=") {
        Some(f) => OsString::from(f),
        None if i < args.len() => args.remove(i),
        None => return Err(ConfigFileError::Missing),
    };
    let from_file = arguments(Path::new(&file))?;
    // right after the subcommand (`stream`; `slot list`), where its options go
    let at = args
        .iter()
        .enumerate()
        .skip(1)
        .find(|(j, a)| {
            SUBCOMMANDS.iter().any(|c| a == c)
                && !matches!(args[j - 1].to_str(), Some("-d" | "--dbname"))
        })
        .map_or(args.len(), |(j, a)| {
            if a == "slot" {
                (j + 2).min(args.len())
            } else {
                j + 1
            }
        });
    args.splice(at..at, from_file);
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn file_options_come_first_and_the_command_line_wins() {
        let dir = std::env::temp_dir().join(format!("pgwal-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("stream.toml");
        std::fs::write(
            &f,
            "slot = \"app\"\npublication = [\"a\", \"b\"]\nstatus_interval = 0.5\ntwo_phase = true\nmessages = false\n",
        )
        .unwrap();
        let got = expand(os(&[
            "pgwal",
            "-d",
            "host=x",
            "stream",
            "--config",
            f.to_str().unwrap(),
            "--slot",
            "other",
        ]))
        .unwrap();
        assert_eq!(
            got,
            os(&[
                "pgwal",
                "-d",
                "host=x",
                "stream",
                "--publication",
                "a",
                "--publication",
                "b",
                "--slot",
                "app",
                "--status-interval",
                "0.5",
                "--two-phase",
                "--slot",
                "other"
            ])
        );
        std::fs::write(&f, "slot = { name = \"x\" }\n").unwrap();
        assert!(
            matches!(expand(os(&["pgwal", "stream", &format!("--config={}", f.display())])),
                         Err(ConfigFileError::Invalid(_, why)) if why.contains("table"))
        );
        std::fs::write(&f, "slot = \n").unwrap();
        assert!(matches!(
            expand(os(&["pgwal", "stream", "--config", f.to_str().unwrap()])),
            Err(ConfigFileError::Invalid(..))
        ));
        assert!(matches!(
            expand(os(&["pgwal", "stream", "--config"])),
            Err(ConfigFileError::Missing)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
