//! The server's life cycle under stress: random start / shutdown / attach / detach / guard
//! operations from many threads while clients send requests.

use workloads::stress::{self, StressConfig};

/// The figure: 8 threads x 2,000 random operations with client traffic running;
/// afterwards no worker thread is left and every request was answered.
#[test]
fn random_lifecycle_ops_under_traffic_leave_one_worker_at_most_none_leaked_all_answered() {
    let report = stress::run(8, 2000);
    println!("{}\n{report}", report.details());
    assert!(
        report.passed(),
        "stress failed: {:?}\n{}\n{report}",
        report.problems(),
        report.details()
    );
    assert!(report.cycles >= 1, "the final start starts a worker");
    assert!(report.sent >= 2 * 200, "the clients made their minimum");
}

/// A tiny run with a fixed seed (`RPC_STRESS_SEED` replays a failing run's choices) passes and
/// accounts for its requests and operations.
#[test]
fn a_small_seeded_run_passes_and_reports_its_seed() {
    let config = StressConfig {
        seed: 42,
        min_requests: 10,
        ..StressConfig::new(2, 50)
    };
    let report = stress::run_with(&config);
    assert!(report.passed(), "{:?}", report.problems());
    assert_eq!(report.seed, 42);
    assert_eq!(report.unanswered, report.sent - report.answered);
    let ops = report.started
        + report.already_running
        + report.stopped
        + report.already_stopped
        + report.refused
        + report.attached
        + report.guards;
    assert!(ops <= 2 * 50, "each operation counted at most once");
}

#[test]
fn splitmix64_is_deterministic_and_spreads() {
    let mut a = stress::SplitMix64::new(7);
    let mut b = stress::SplitMix64::new(7);
    let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
    let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
    assert_eq!(xs, ys);
    let mut hits = [0u32; 5];
    for _ in 0..5000 {
        hits[a.below(5) as usize] += 1;
    }
    assert!(hits.iter().all(|&h| (800..1200).contains(&h)), "{hits:?}");
}
