//! `cargo xtask sanitize [thread|address]... [-- TEST ARGS]`: rpc-core's tests (unit and
//! integration, not doctests) and the `workloads` crate's (adversarial clients, faults,
//! interleaving, stress) under ThreadSanitizer and AddressSanitizer (default: both, one after
//! the other), on the nightly toolchain with the standard library rebuilt instrumented
//! (`-Zbuild-std`, which needs the `rust-src` component: added when missing). Each sanitizer
//! builds into its own target directory (`target/sanitize-thread`, `target/sanitize-address`).
//! What works, what does not and why: docs/reliability.md, "Sanitizers".

use crate::project_root;
use std::process::Command;

const TARGET: &str = "x86_64-unknown-linux-gnu";
/// Tests that measure time or CPU and mean nothing under a sanitizer's slowdown.
const SKIP: &[&str] = &["an_idle_server_uses_no_measurable_cpu"];
/// Skipped under ThreadSanitizer only: the test writes into memory the server allocated for
/// MALLOC, ordered after the allocation by the protocol's `fence(Release)` / `fence(Acquire)`
/// pair around relaxed flag accesses. TSan does not model standalone fences, so it reports that
/// (correctly ordered) write as a race. The mailbox itself is all atomics and never reported.
const SKIP_THREAD: &[&str] = &["malloc_and_free_through_the_plugin_allocator"];

/// `cargo xtask sanitize`'s arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The sanitizers to run under, one after the other [default: thread address]
    #[arg(value_name = "SANITIZER", value_parser = ["thread", "address"])]
    sanitizers: Vec<String>,
    /// Arguments for the test binaries (a filter, say)
    #[arg(last = true, value_name = "TEST-ARGS")]
    test_args: Vec<String>,
}

pub fn run(args: &Args) -> crate::Result {
    let sanitizers: Vec<&str> = match args.sanitizers.as_slice() {
        [] => vec!["thread", "address"],
        chosen => chosen.iter().map(String::as_str).collect(),
    };
    let test_args = &args.test_args;
    crate::nightly::ensure_component("rust-src")?;
    let root = project_root();
    for sanitizer in sanitizers {
        let flags = format!("-Zsanitizer={sanitizer} -Cdebuginfo=1");
        let mut command = Command::new("cargo");
        command
            .current_dir(&root)
            .env("RUSTFLAGS", &flags)
            .env("RUSTDOCFLAGS", &flags)
            .env(
                "CARGO_TARGET_DIR",
                root.join("target").join(format!("sanitize-{sanitizer}")),
            )
            // Tests that measure the process (its memory) read it: a sanitizer's shadow memory
            // and quarantine are not the code's.
            .env("RPC_SANITIZER", sanitizer)
            .env("TSAN_OPTIONS", "halt_on_error=1 second_deadlock_stack=1")
            .env(
                "ASAN_OPTIONS",
                "detect_leaks=1 detect_stack_use_after_return=1",
            )
            .args(["+nightly", "test", "-Zbuild-std", "--target", TARGET])
            .args([
                "-p",
                "gpu-rpc-core",
                "-p",
                "workloads",
                "--lib",
                "--tests",
                "--",
            ]);
        let only_thread = if sanitizer == "thread" {
            SKIP_THREAD
        } else {
            &[]
        };
        for skip in SKIP.iter().chain(only_thread) {
            command.args(["--skip", skip]);
        }
        command.args(test_args);
        eprintln!("sanitize: {sanitizer}: {command:?}");
        let status = command.status().map_err(|e| format!("cargo: {e}"))?;
        if !status.success() {
            return Err(format!("rpc-core's tests under {sanitizer} sanitizer: {status}").into());
        }
        println!("sanitize: {sanitizer}: the tests pass");
    }
    Ok(())
}
