//! `cargo xtask test`: every check CI runs, in order, stopping at the first failure.
//!
//! Each step is one cargo command in [`STEPS`]; adding a step is adding one line there. A step
//! that needs a nightly component (miri) runs where that component is installed or can be
//! added, and is skipped with the reason elsewhere (as CI handles the sanitizers' `rust-src`).
//!
//! `--beside-busy N` runs only rpc-core's and the workloads' tests, beside N busy threads of
//! its own (a node whose other processes busy-poll, as MPI ranks do): every verdict must hold
//! however slow the CPUs are, since a test's deadlines are hang guards, never what it checks
//! (docs/reliability.md, "Verdicts independent of time").

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::{cargo, project_root, Failure, Result};

/// One cargo invocation: a short name, its arguments, and extra environment.
struct Step<'a> {
    name: &'static str,
    args: &'a [&'a str],
    env: &'static [(&'static str, &'static str)],
    /// The nightly component the step needs, if any: it then runs `cargo +nightly`, and is
    /// skipped (saying why) where the component is neither installed nor can be added.
    nightly: Option<&'static str>,
}

const fn step<'a>(name: &'static str, args: &'a [&'a str]) -> Step<'a> {
    Step {
        name,
        args,
        env: &[],
        nightly: None,
    }
}

/// The loom models build with `--cfg loom` into their own target folder, so they do not evict
/// the normal build; two preemptions keep the models' state spaces small enough for CI.
const LOOM_ENV: &[(&str, &str)] = &[
    ("RUSTFLAGS", "--cfg loom"),
    ("LOOM_MAX_PREEMPTIONS", "2"),
    ("CARGO_TARGET_DIR", "target/loom"),
];

/// Under miri: rpc-core's protocol and server-thread tests (real threads over a real heap
/// region: every access checked for data races, mixed-size and out-of-bounds accesses, bad
/// alignment), and its unit tests but the services' and printf's, which call the C library
/// (`snprintf`, `fopen`, `openat2`) miri cannot run. The tests scale their loops down under
/// miri (`cfg!(miri)`).
const MIRI_ARGS: &[&str] = &[
    "miri",
    "test",
    "-p",
    "gpu-rpc-core",
    "--lib",
    "--test",
    "protocol",
    "--test",
    "server_thread",
    "--",
    "--skip",
    "printf::",
    "--skip",
    "services::",
];

/// miri in its own target folder (cargo miri's default), isolated from the host (no files, no
/// real clock: a virtual one), with the seed of its scheduler fixed so a failure replays.
const MIRI_ENV: &[(&str, &str)] = &[("MIRIFLAGS", "-Zmiri-seed=1")];

const STEPS: &[Step<'static>] = &[
    // First: the layering and file rules (`tidy.rs`), which take a second and explain
    // themselves where a later step's failure would not.
    step("tidy", &["run", "--quiet", "-p", "xtask", "--", "tidy"]),
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
    Step {
        name: "doc",
        args: &["doc", "--no-deps", "--workspace"],
        // Every intra-doc link must resolve, in the docs a user builds.
        env: &[("RUSTDOCFLAGS", "-D warnings")],
        nightly: None,
    },
    step("tests", &["test", "--workspace"]),
    Step {
        name: "loom",
        args: &["test", "-p", "gpu-rpc-core", "--release", "--lib", "loom"],
        env: LOOM_ENV,
        nightly: None,
    },
    Step {
        name: "miri",
        args: MIRI_ARGS,
        env: MIRI_ENV,
        nightly: Some("miri"),
    },
    Step {
        name: "miri (plugin-host memory)",
        args: &["miri", "test", "-p", "plugin-host", "--lib", "memory::"],
        env: MIRI_ENV,
        nightly: Some("miri"),
    },
    // `rustc`, not `build`: its flags reach rpc-core alone, so the no_std build is held to
    // no warnings as the others are by clippy, without rebuilding the dependencies.
    step(
        "no_std client",
        &[
            "rustc",
            "-p",
            "gpu-rpc-core",
            "--no-default-features",
            "--lib",
            "--",
            "-D",
            "warnings",
        ],
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

/// `cargo xtask test`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only rpc-core's and the workloads' tests, run beside N busy threads (built first,
    /// without them)
    #[arg(long, value_name = "N", value_parser = crate::flags::number(1u32, 64))]
    beside_busy: Option<u32>,
}

/// The suites run beside busy threads, first built without them.
const BESIDE_BUSY: &[&str] = &["test", "-p", "gpu-rpc-core", "-p", "workloads"];

pub fn run(args: &Args) -> Result {
    match args.beside_busy {
        Some(threads) => run_beside_busy(threads),
        None => run_steps(STEPS),
    }
}

/// Builds the suites of [`BESIDE_BUSY`], then runs them beside `threads` busy threads, which
/// stop when they end.
fn run_beside_busy(threads: u32) -> Result {
    let build = [BESIDE_BUSY, &["--no-run"]].concat();
    run_steps(&[Step {
        name: "build the tests",
        args: &build,
        env: &[],
        nightly: None,
    }])?;
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = (0..threads)
        .map(|_| {
            let stop = stop.clone();
            // A loop that never waits, as a busy-polling process's; Relaxed: only the flag
            // itself is shared.
            std::thread::spawn(move || while !stop.load(Ordering::Relaxed) {})
        })
        .collect();
    println!("xtask test: {threads} busy threads running");
    let result = run_steps(&[step("tests beside busy threads", BESIDE_BUSY)]);
    stop.store(true, Ordering::Relaxed);
    for thread in busy {
        let _ = thread.join();
    }
    result
}

/// Runs `steps` in order, stopping at the first failure; a step whose nightly component cannot
/// be had is skipped (and said so).
fn run_steps(steps: &[Step]) -> Result {
    let began = Instant::now();
    let total = steps.len();
    let mut skipped = 0;
    for (k, step) in steps.iter().enumerate() {
        let shown = shown(step);
        if let Some(component) = step.nightly {
            if let Err(why) = crate::nightly::ensure_component(component) {
                println!(
                    "xtask test: [{}/{total}] {}: skipped ({why}): {shown}",
                    k + 1,
                    step.name
                );
                skipped += 1;
                continue;
            }
        }
        println!("xtask test: [{}/{total}] {}: {shown}", k + 1, step.name);
        let started = Instant::now();
        let mut command = match step.nightly {
            // The rustup proxy, which understands `+nightly` (`$CARGO` is stable's own cargo).
            Some(_) => {
                let mut command = Command::new("cargo");
                command.arg("+nightly");
                command
            }
            None => Command::new(cargo()),
        };
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
        "xtask test: {} steps passed, {skipped} skipped, in {:.1} s",
        total - skipped,
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
    let toolchain = if step.nightly.is_some() {
        "+nightly "
    } else {
        ""
    };
    line + "cargo " + toolchain + &step.args.join(" ")
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
             cargo test -p gpu-rpc-core --release --lib loom"
        );
    }

    #[test]
    fn the_miri_step_runs_on_nightly() {
        let miri = STEPS.iter().find(|s| s.name == "miri").unwrap();
        assert_eq!(miri.nightly, Some("miri"));
        assert!(shown(miri)
            .starts_with("MIRIFLAGS=-Zmiri-seed=1 cargo +nightly miri test -p gpu-rpc-core"));
    }

    #[test]
    fn a_step_whose_nightly_component_cannot_be_had_is_skipped() {
        let steps = [Step {
            name: "impossible",
            args: &["no-such-cargo-command"],
            env: &[],
            nightly: Some("no-such-component"),
        }];
        assert_eq!(run_steps(&steps), Ok(()));
    }
}
