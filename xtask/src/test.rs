//! `cargo xtask test`: every check CI runs, in order, stopping at the first failure.
//!
//! Each step is one cargo command in [`STEPS`]; adding a step is adding one line there.

use std::process::Command;
use std::time::Instant;

use crate::{cargo, project_root, Failure, Result};

/// One cargo invocation: a short name, its arguments, and extra environment.
struct Step {
    name: &'static str,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

const fn step(name: &'static str, args: &'static [&'static str]) -> Step {
    Step {
        name,
        args,
        env: &[],
    }
}

/// The loom models build with `--cfg loom` into their own target folder, so they do not evict
/// the normal build; two preemptions keep the models' state spaces small enough for CI.
const LOOM_ENV: &[(&str, &str)] = &[
    ("RUSTFLAGS", "--cfg loom"),
    ("LOOM_MAX_PREEMPTIONS", "2"),
    ("CARGO_TARGET_DIR", "target/loom"),
];

const STEPS: &[Step] = &[
    step("fmt", &["fmt", "--all", "--", "--check"]),
    step(
        "clippy",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    ),
    step("tests", &["test", "--workspace"]),
    Step {
        name: "loom",
        args: &["test", "-p", "rpc-core", "--release", "--lib", "loom"],
        env: LOOM_ENV,
    },
    step(
        "no_std client",
        &["build", "-p", "rpc-core", "--no-default-features"],
    ),
    step(
        "soak",
        &[
            "run",
            "--quiet",
            "-p",
            "xtask",
            "--",
            "soak",
            "--seconds",
            "30",
        ],
    ),
];

pub fn run(args: &[String]) -> Result {
    if let Some(arg) = args.first() {
        return Err(Failure::Usage(format!(
            "test: takes no arguments, got `{arg}`"
        )));
    }
    let began = Instant::now();
    let total = STEPS.len();
    for (k, step) in STEPS.iter().enumerate() {
        let shown = shown(step);
        println!("xtask test: [{}/{total}] {}: {shown}", k + 1, step.name);
        let started = Instant::now();
        let mut command = Command::new(cargo());
        command.args(step.args).current_dir(project_root());
        for (key, value) in step.env {
            command.env(key, value);
        }
        let status = command
            .status()
            .map_err(|e| format!("test: could not run `{shown}`: {e}"))?;
        if !status.success() {
            return Err(Failure::Failed(format!(
                "test: step {}/{total} `{}` failed ({status}) after {:.1} s: {shown}",
                k + 1,
                step.name,
                started.elapsed().as_secs_f64()
            )));
        }
        println!(
            "xtask test: [{}/{total}] {} ok in {:.1} s",
            k + 1,
            step.name,
            started.elapsed().as_secs_f64()
        );
    }
    println!(
        "xtask test: {total} steps passed in {:.1} s",
        began.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The step as a shell line, e.g. `RUSTFLAGS="--cfg loom" cargo test ...`.
fn shown(step: &Step) -> String {
    let mut line = String::new();
    for (key, value) in step.env {
        if value.contains(' ') {
            line += &format!("{key}=\"{value}\" ");
        } else {
            line += &format!("{key}={value} ");
        }
    }
    line + "cargo " + &step.args.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loom_step_is_shown_as_a_shell_line() {
        let loom = STEPS.iter().find(|s| s.name == "loom").unwrap();
        assert_eq!(
            shown(loom),
            "RUSTFLAGS=\"--cfg loom\" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
             cargo test -p rpc-core --release --lib loom"
        );
    }

    #[test]
    fn arguments_are_refused() {
        assert!(matches!(
            run(&["--quick".to_string()]),
            Err(Failure::Usage(_))
        ));
    }
}
