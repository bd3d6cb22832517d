//! `cargo xtask stress [--threads T] [--ops N]`: the server life-cycle stress of the `workloads`
//! crate ([`workloads::stress`]) at the given size; the last line is its summary.

use crate::flags::{env_number, number};
use crate::{Failure, Result};

/// `cargo xtask stress`'s flags. Each thread is a real thread with its own generator; each op
/// a few requests.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Client threads
    #[arg(long, value_name = "T", default_value = "8", value_parser = number(1usize, 256),
          allow_negative_numbers = true)]
    threads: usize,
    /// Operations per thread
    #[arg(long, value_name = "N", default_value = "2000",
          value_parser = number(1usize, 10_000_000), allow_negative_numbers = true)]
    ops: usize,
}

pub fn run(args: &Args) -> Result {
    let (threads, ops) = (args.threads, args.ops);
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
