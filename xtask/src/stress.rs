//! `cargo xtask stress [--threads T] [--ops N]`: the server life-cycle stress of the `workloads`
//! crate ([`workloads::stress`]) at the given size; the last line is its summary.

use crate::flags::{env_number, Flags};
use crate::{Failure, Result};

pub fn run(args: &[String]) -> Result {
    let flags = Flags::parse("stress", args, &["threads", "ops"])?;
    // Each thread is a real thread with its own generator; each op a few requests.
    let threads = flags.number("threads", Some(8), 1, 256)? as usize;
    let ops = flags.number("ops", Some(2000), 1, 10_000_000)? as usize;
    // Checked here first, so a bad seed is a usage error rather than the stress's panic.
    env_number("stress", "RPC_STRESS_SEED")?;
    let config = workloads::stress::StressConfig::new(threads, ops);
    let report = workloads::stress::run_with(&config);
    println!("{}", report.details());
    for problem in report.problems() {
        println!("problem: {problem}");
    }
    println!("{report}");
    if report.passed() {
        Ok(())
    } else {
        Err(Failure::Failed(format!(
            "stress failed (replay with RPC_STRESS_SEED={})",
            report.seed
        )))
    }
}
