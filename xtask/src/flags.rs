//! What the commands' flags share: whole numbers within a range, whose error names the range
//! (clap's own ranged parser says only "too large" when the digits overflow), and numbers
//! from the environment. Clap does the rest (see `main.rs`).

use std::fmt::Display;
use std::str::FromStr;

use rpc_core::protocol::Generation;

use crate::{Failure, Result};

/// A clap value parser of a mailbox generation: `v0`, `v1` or `v2` (listed in `--help`).
pub fn generation() -> impl clap::builder::TypedValueParser<Value = Generation> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["v0", "v1", "v2"])
        .try_map(|name| name.parse::<Generation>())
}

/// A clap value parser of whole numbers from `min` to `max`; anything else (words, a sign,
/// digits past the type) is refused with a message naming the range.
pub fn number<T>(min: T, max: T) -> impl Fn(&str) -> std::result::Result<T, String> + Clone
where
    T: FromStr + PartialOrd + Display + Copy + Send + Sync + 'static,
{
    move |text| {
        text.parse::<T>()
            .ok()
            .filter(|n| (min..=max).contains(n))
            .ok_or_else(|| format!("wants a whole number from {min} to {max}"))
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

    #[test]
    fn numbers_are_bounded_and_overflow_names_the_range() {
        let parse = number(1u64, 64);
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
            match parse(text) {
                Ok(n) => assert!(ok && n.to_string() == text, "{text}"),
                Err(why) => {
                    assert!(!ok, "{text}: {why}");
                    assert_eq!(why, "wants a whole number from 1 to 64");
                }
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
}
