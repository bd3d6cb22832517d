//! `cargo xtask stress [--threads T] [--ops N]`: the server life-cycle stress of the `workloads`
//! crate ([`workloads::stress`]) at the given size; the last line is its summary.

use crate::flags::Flags;
use crate::{Failure, Result};

pub fn run(args: &[String]) -> Result {
    let flags = Flags::parse("stress", args, &["threads", "ops"])?;
    let threads: usize = flags.number("threads", Some(8))?;
    let ops: usize = flags.number("ops", Some(2000))?;
    if threads == 0 {
        return Err(Failure::Usage(
            "stress: --threads must be at least 1".into(),
        ));
    }
    let report = workloads::stress::run(threads, ops);
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
