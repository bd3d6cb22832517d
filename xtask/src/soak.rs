//! `cargo xtask soak [--seconds S]`: two plugin-host runtimes with mixed traffic for S seconds
//! (default 30), then exactly one line on stdout:
//! `requests=.. answered=.. lost=0 errors_expected=.. errors_unexpected=0 leaked=0`.
//! Fails (exit 1) if anything was lost, failed unexpectedly or leaked. The soak itself lives in
//! the `tests` crate (`tests::soak`), beside the other reliability tests.

pub fn run(args: &[String]) -> Result<(), String> {
    let mut seconds = 30;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .ok_or("--seconds needs a value")?
                    .parse()
                    .map_err(|e| format!("--seconds: {e}"))?;
            }
            other => {
                return Err(format!(
                    "soak: unknown argument {other}; usage: cargo xtask soak [--seconds S]"
                ))
            }
        }
    }
    let report = tests::soak::run(seconds)?;
    println!("{report}");
    if report.clean() {
        Ok(())
    } else {
        Err("soak: requests were lost, failed unexpectedly or leaked".into())
    }
}
