//! Hand-rolled flag parsing: `--name value` or `--name=value`, each flag at most once, no
//! positional arguments. Enough for every command here; no parser crate needed.

use crate::{Failure, Result};

/// Flags given on a command line, checked against the names a command accepts.
#[derive(Debug)]
pub struct Flags {
    command: &'static str,
    given: Vec<(String, String)>,
}

impl Flags {
    /// Parses `args` for `command`, accepting only the flags named in `allowed` (without `--`).
    pub fn parse(command: &'static str, args: &[String], allowed: &[&str]) -> Result<Flags> {
        let usage = |why: String| Failure::Usage(format!("{command}: {why}"));
        let mut given: Vec<(String, String)> = Vec::new();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let Some(flag) = arg.strip_prefix("--") else {
                return Err(usage(format!("unexpected argument `{arg}`")));
            };
            let (name, value) = match flag.split_once('=') {
                Some((name, value)) => (name.to_string(), value.to_string()),
                None => {
                    let value = args
                        .next()
                        .ok_or_else(|| usage(format!("--{flag} needs a value")))?;
                    (flag.to_string(), value.clone())
                }
            };
            if !allowed.contains(&name.as_str()) {
                return Err(usage(format!("unknown flag --{name}")));
            }
            if given.iter().any(|(n, _)| *n == name) {
                return Err(usage(format!("--{name} given twice")));
            }
            given.push((name, value));
        }
        Ok(Flags { command, given })
    }

    /// The value of `--name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.given
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `--name`, which must be given.
    pub fn required(&self, name: &str) -> Result<&str> {
        self.get(name)
            .ok_or_else(|| Failure::Usage(format!("{}: --{name} is required", self.command)))
    }

    /// `--name` as a number, or `default` when absent.
    pub fn number<T: std::str::FromStr>(&self, name: &str, default: Option<T>) -> Result<T> {
        let text = match (self.get(name), default) {
            (Some(text), _) => text,
            (None, Some(default)) => return Ok(default),
            (None, None) => self.required(name)?,
        };
        text.parse().map_err(|_| {
            Failure::Usage(format!(
                "{}: --{name} wants a non-negative integer, not `{text}`",
                self.command
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn both_spellings_parse() {
        let flags = Flags::parse("t", &args(&["--a", "1", "--b=two"]), &["a", "b"]).unwrap();
        assert_eq!(flags.get("a"), Some("1"));
        assert_eq!(flags.get("b"), Some("two"));
        assert_eq!(flags.number::<u32>("a", None), Ok(1));
        assert_eq!(flags.number::<u32>("c", Some(9)), Ok(9));
    }

    #[test]
    fn misuse_is_a_usage_error() {
        for bad in [
            &["--a"][..],
            &["a"],
            &["--z", "1"],
            &["--a", "1", "--a", "2"],
        ] {
            let result = Flags::parse("t", &args(bad), &["a"]);
            assert!(matches!(result, Err(Failure::Usage(_))), "{bad:?}");
        }
        let flags = Flags::parse("t", &args(&["--a", "x"]), &["a"]).unwrap();
        assert!(matches!(
            flags.number::<u32>("a", None),
            Err(Failure::Usage(_))
        ));
        assert!(matches!(flags.required("b"), Err(Failure::Usage(_))));
    }
}
