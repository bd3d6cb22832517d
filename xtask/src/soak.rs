//! `cargo xtask soak [--seconds S]`: two plugin-host runtimes with mixed traffic for S seconds
//! (default 30), then exactly one line on stdout:
//! `requests=.. answered=.. lost=0 errors_expected=.. errors_unexpected=0 leaked=0`.
//! Fails (exit 1) if anything was lost, failed unexpectedly or leaked. The soak itself lives in
//! the `workloads` crate (`workloads::soak`), beside the other reliability tests.

use crate::flags::Flags;
use crate::Result;

pub fn run(args: &[String]) -> Result {
    let seconds = Flags::parse("soak", args, &["seconds"])?.number("seconds", Some(30))?;
    let report = workloads::soak::run(seconds)?;
    println!("{report}");
    if report.clean() {
        Ok(())
    } else {
        Err(crate::Failure::Failed(
            "soak: requests were lost, failed unexpectedly or leaked".into(),
        ))
    }
}
