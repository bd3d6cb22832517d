//! Flag parsing for every command, with `lexopt` (as rpc-serve): `--name value` or
//! `--name=value`, switches without a value, each flag at most once, no positional arguments,
//! and `--help`/`-h` anywhere, which prints the command's lines of the usage and exits 0.
//! Every misuse is a [`Failure::Usage`] (exit status 2, one format); numbers are bounded.

use std::ffi::OsString;

use crate::{Failure, Result};

/// Flags given on a command line, checked against the names a command accepts.
#[derive(Debug)]
pub struct Flags {
    command: &'static str,
    given: Vec<(String, Option<String>)>,
}

impl Flags {
    /// Parses `args` for `command`, accepting only the flags named in `valued` (without `--`),
    /// each with a value.
    pub fn parse(command: &'static str, args: &[String], valued: &[&str]) -> Result<Flags> {
        Self::parse_with(command, args, valued, &[])
    }

    /// [`Flags::parse`], also accepting the `switches`, flags without a value.
    pub fn parse_with(
        command: &'static str,
        args: &[String],
        valued: &[&str],
        switches: &[&str],
    ) -> Result<Flags> {
        let usage = |why: String| Failure::Usage(format!("{command}: {why}"));
        // `--help` wins wherever it is, even after a mistake.
        let ours = args.iter().take_while(|a| *a != "--");
        if ours.into_iter().any(|a| a == "--help" || a == "-h") {
            return Err(Failure::Help(crate::usage_of(command)));
        }
        let mut parser = lexopt::Parser::from_args(args.iter().map(OsString::from));
        let mut given: Vec<(String, Option<String>)> = Vec::new();
        while let Some(arg) = parser.next().map_err(|e| usage(e.to_string()))? {
            let name = match arg {
                lexopt::Arg::Long(name) => name.to_string(),
                lexopt::Arg::Short(c) => return Err(usage(format!("unknown flag -{c}"))),
                lexopt::Arg::Value(value) => {
                    let value = value.to_string_lossy();
                    return Err(usage(format!("unexpected argument `{value}`")));
                }
            };
            let value = if switches.contains(&name.as_str()) {
                if let Some(value) = parser.optional_value() {
                    let value = value.to_string_lossy();
                    return Err(usage(format!("--{name} takes no value (got `{value}`)")));
                }
                None
            } else if valued.contains(&name.as_str()) {
                let value = parser.value().map_err(|e| usage(e.to_string()))?;
                let value = value.into_string().map_err(|v| {
                    usage(format!("--{name}: `{}` is not UTF-8", v.to_string_lossy()))
                })?;
                Some(value)
            } else {
                return Err(usage(format!("unknown flag --{name}")));
            };
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
            .and_then(|(_, v)| v.as_deref())
    }

    /// Whether the switch `--name` was given.
    pub fn switch(&self, name: &str) -> bool {
        self.given.iter().any(|(n, v)| n == name && v.is_none())
    }

    /// The value of `--name`, which must be given.
    pub fn required(&self, name: &str) -> Result<&str> {
        self.get(name)
            .ok_or_else(|| Failure::Usage(format!("{}: --{name} is required", self.command)))
    }

    /// `--name` as a number from `min` to `max`, or `default` when absent.
    pub fn number(&self, name: &str, default: Option<u64>, min: u64, max: u64) -> Result<u64> {
        let text = match (self.get(name), default) {
            (Some(text), _) => text,
            (None, Some(default)) => return Ok(default),
            (None, None) => self.required(name)?,
        };
        match text.parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            // Not a number, or digits past u64: either way the range is what to say.
            _ => Err(Failure::Usage(format!(
                "{}: --{name} wants a whole number from {min} to {max}, not `{text}`",
                self.command
            ))),
        }
    }
}

/// An environment variable holding a number (a seed, say): `None` if unset, a usage error if
/// set to anything but a whole number (never silently ignored).
pub fn env_number(command: &str, variable: &str) -> Result<Option<u64>> {
    match std::env::var(variable) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Ok(text) if text.parse::<u64>().is_ok() => Ok(text.parse().ok()),
        Ok(text) => Err(Failure::Usage(format!(
            "{command}: {variable} wants a whole number, not `{text}`"
        ))),
        Err(std::env::VarError::NotUnicode(text)) => Err(Failure::Usage(format!(
            "{command}: {variable} wants a whole number, not `{}`",
            text.to_string_lossy()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn usage_error(result: Result<Flags>) -> String {
        match result {
            Err(Failure::Usage(why)) => why,
            other => panic!("not a usage error: {other:?}"),
        }
    }

    #[test]
    fn both_spellings_and_switches_parse() {
        let given = args(&["--a", "1", "--b=two", "--on"]);
        let flags = Flags::parse_with("t", &given, &["a", "b"], &["on", "off"]).unwrap();
        assert_eq!(flags.get("a"), Some("1"));
        assert_eq!(flags.get("b"), Some("two"));
        assert!(flags.switch("on"));
        assert!(!flags.switch("off"));
        assert_eq!(flags.number("a", None, 0, 9), Ok(1));
        assert_eq!(flags.number("c", Some(9), 0, 9), Ok(9));
    }

    #[test]
    fn misuse_is_a_usage_error_that_names_the_problem() {
        let cases: [(&[&str], &str); 6] = [
            (&["--a"], "missing argument"),
            (&["a"], "unexpected argument `a`"),
            // An unknown flag last is unknown, not "needs a value".
            (&["--frob"], "unknown flag --frob"),
            (&["--z", "1"], "unknown flag --z"),
            (&["--a", "1", "--a", "2"], "--a given twice"),
            (&["--on=1"], "--on takes no value"),
        ];
        for (bad, want) in cases {
            let why = usage_error(Flags::parse_with("t", &args(bad), &["a"], &["on"]));
            assert!(why.contains(want), "{bad:?}: {why}");
        }
        let flags = Flags::parse("t", &args(&["--a", "x"]), &["a"]).unwrap();
        assert!(matches!(flags.required("b"), Err(Failure::Usage(_))));
    }

    #[test]
    fn numbers_are_bounded_and_overflow_says_so() {
        for (text, ok) in [
            ("0", false),
            ("1", true),
            ("64", true),
            ("65", false),
            ("99999999999", false),
            ("99999999999999999999999", false),
            ("-1", false),
            ("six", false),
        ] {
            let flags = Flags::parse("t", &args(&["--n", text]), &["n"]).unwrap();
            match flags.number("n", None, 1, 64) {
                Ok(n) => assert!(ok && n.to_string() == text, "{text}"),
                Err(Failure::Usage(why)) => {
                    assert!(!ok, "{text}: {why}");
                    assert!(why.contains("from 1 to 64") && why.contains(text), "{why}");
                }
                Err(other) => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_seed_in_the_environment_is_a_number_or_a_usage_error() {
        // A variable of this test's own, so no other test sees it change.
        let variable = "XTASK_FLAGS_TEST_SEED";
        std::env::remove_var(variable);
        assert_eq!(env_number("t", variable), Ok(None));
        std::env::set_var(variable, "42");
        assert_eq!(env_number("t", variable), Ok(Some(42)));
        std::env::set_var(variable, "banana");
        assert!(
            matches!(env_number("t", variable), Err(Failure::Usage(why)) if why.contains("banana"))
        );
        std::env::remove_var(variable);
    }

    #[test]
    fn help_anywhere_is_the_commands_usage() {
        for given in [&["--help"][..], &["--a", "1", "-h"], &["--frob", "--help"]] {
            match Flags::parse("layout", &args(given), &["a"]) {
                Err(Failure::Help(text)) => assert!(text.contains("layout --gen"), "{text}"),
                other => panic!("{given:?}: {other:?}"),
            }
        }
    }
}
