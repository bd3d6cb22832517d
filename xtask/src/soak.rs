//! `cargo xtask soak [--seconds S] [--json]`: two plugin-host runtimes with mixed traffic for S
//! seconds (default 30), then exactly one line on stdout:
//! `requests=.. answered=.. lost=0 errors_expected=.. errors_unexpected=0 leaked=0`, or with
//! `--json` one JSON object with the same fields and `"clean"`. Fails (exit 1) if anything was
//! lost, failed unexpectedly or leaked. The soak itself lives in the `workloads`
//! crate (`workloads::soak`), beside the other reliability tests.

use crate::flags::number;
use crate::Result;

/// `cargo xtask soak`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// How long to run
    #[arg(long, value_name = "S", default_value = "30", value_parser = number(1u64, 86_400),
          allow_negative_numbers = true)]
    seconds: u64,
    /// The summary as one JSON object
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> Result {
    let report = workloads::soak::run(args.seconds)?;
    if args.json {
        println!("{}", json(&report));
    } else {
        println!("{report}");
    }
    if report.clean() {
        Ok(())
    } else {
        Err(crate::Failure::Failed(
            "soak: requests were lost, failed unexpectedly or leaked".into(),
        ))
    }
}

fn json(report: &workloads::soak::Report) -> serde_json::Value {
    serde_json::json!({
        "requests": report.requests,
        "answered": report.answered,
        "lost": report.lost,
        "errors_expected": report.errors_expected,
        "errors_unexpected": report.errors_unexpected,
        "leaked": report.leaked,
        "clean": report.clean(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_json_line_has_every_field_of_the_text_line() {
        let report = workloads::soak::Report {
            requests: 10,
            answered: 9,
            lost: 1,
            ..Default::default()
        };
        let json = super::json(&report);
        for field in report.to_string().split(' ') {
            let (name, value) = field.split_once('=').unwrap();
            assert_eq!(json[name].as_u64(), value.parse().ok(), "{name}");
        }
        assert_eq!(json["clean"], false);
    }
}
