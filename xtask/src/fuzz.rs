//! `cargo xtask fuzz [--seconds S] [--target mailbox|printf]`: runs each fuzz target of `fuzz/`
//! (cargo-fuzz, nightly toolchain, AddressSanitizer on) for S seconds (default 60), after
//! seeding its corpus `fuzz/corpus/<target>/` with a few well-formed inputs. Installs
//! `cargo-fuzz` from crates.io when it is missing. A crash, a leak or an input slower than 10 s
//! fails the command; libFuzzer leaves the input in `fuzz/artifacts/<target>/`.

use std::process::Command;

use crate::flags::number;
use crate::project_root;
use rpc_core::protocol::{Generation, Layout};
use rpc_core::Opcode;

const TARGETS: [&str; 2] = ["mailbox", "printf"];

/// `cargo xtask fuzz`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// How long to fuzz each target
    #[arg(long, value_name = "S", default_value = "60", value_parser = number(1u64, 86_400),
          allow_negative_numbers = true)]
    seconds: u64,
    /// Only this target [default: both]
    #[arg(long, value_name = "TARGET", value_parser = TARGETS)]
    target: Option<String>,
}

pub fn run(args: &Args) -> crate::Result {
    let seconds = args.seconds;
    let targets: Vec<&str> = match &args.target {
        None => TARGETS.to_vec(),
        Some(name) => vec![name.as_str()],
    };
    let fuzz_dir = project_root().join("fuzz");
    ensure_cargo_fuzz()?;
    for target in targets {
        let corpus = fuzz_dir.join("corpus").join(target);
        std::fs::create_dir_all(&corpus).map_err(|e| format!("{}: {e}", corpus.display()))?;
        for (k, seed) in seeds(target).iter().enumerate() {
            let path = corpus.join(format!("seed-{k}"));
            std::fs::write(&path, seed).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        eprintln!("fuzz: {target} for {seconds} s");
        let status = Command::new("cargo")
            .current_dir(&fuzz_dir)
            .args(["+nightly", "fuzz", "run", target, "--"])
            .arg(format!("-max_total_time={seconds}"))
            .args(["-timeout=10", "-rss_limit_mb=4096", "-print_final_stats=1"])
            .status()
            .map_err(|e| format!("cargo fuzz: {e}"))?;
        if !status.success() {
            return Err(format!(
                "fuzz target {target} failed ({status}); see fuzz/artifacts/{target}/"
            )
            .into());
        }
        let inputs = std::fs::read_dir(&corpus).map(|d| d.count()).unwrap_or(0);
        println!("fuzz: {target}: {seconds} s, no crash, corpus {inputs} inputs");
    }
    Ok(())
}

fn ensure_cargo_fuzz() -> Result<(), String> {
    let present = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        return Ok(());
    }
    eprintln!("fuzz: installing cargo-fuzz");
    let status = Command::new("cargo")
        .args(["install", "cargo-fuzz", "--locked"])
        .status()
        .map_err(|e| format!("cargo install: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err("cargo install cargo-fuzz failed".into())
    }
}

/// Well-formed inputs for a target (the fuzzer mutates from there).
fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "printf" => printf_seeds(),
        _ => mailbox_seeds(),
    }
}

fn printf_seeds() -> Vec<Vec<u8>> {
    let seed = |packed: u8, format: &str, args: &[u8]| {
        let mut bytes = vec![packed];
        bytes.extend_from_slice(format.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(args);
        bytes
    };
    let mut int_str_double = Vec::new();
    int_str_double.extend_from_slice(&(-42i32).to_le_bytes());
    int_str_double.extend_from_slice(&[0; 4]);
    int_str_double.extend_from_slice(&0x1000u64.to_le_bytes());
    int_str_double.extend_from_slice(&1.5f64.to_le_bytes());
    let mut stars = Vec::new();
    for v in [8i32, 3, 12345] {
        stars.extend_from_slice(&v.to_le_bytes());
    }
    // A pointer to a string longer than a piece (see the target: a multiple of 61, not of 7).
    let long_string = (61u64 * 11).to_le_bytes();
    vec![
        seed(0, "%d %s %f\n", &int_str_double),
        seed(1, "%d %s %f\n", &int_str_double),
        seed(
            0,
            "%s|%-5000s|%.*s",
            &[&long_string[..], &long_string, &[9, 0, 0, 0], &long_string].concat(),
        ),
        seed(
            1,
            "%.4096f %4096d",
            &[&f64::MAX.to_le_bytes()[..], &[1, 0, 0, 0]].concat(),
        ),
        seed(0, "%*.*d|%-10s|%5.2e|%%|%c", &stars),
        seed(0, "%lld %llx %p %hhu %jd %zu %Lf %a %G %n", &[0x7f; 80]),
        seed(1, "plain text, no conversions", &[]),
    ]
}

/// A mailbox image (after the layout byte) holding one pending request on port 0 of a v1,
/// one-lane, one-port mailbox: `C = 1`, `S = 0`, the header, and the first packet (the target
/// lays the input over two mailboxes: the last seed has a request in each).
fn mailbox_seeds() -> Vec<Vec<u8>> {
    let layout = Layout::new(Generation::V1, 1, 1).expect("valid");
    let region = |opcode: Opcode, words: &[u64], tail: &[u8]| {
        let mut region = vec![0u8; layout.total_size()];
        region[layout.secondary()..][..4].copy_from_slice(&1u32.to_le_bytes());
        region[layout.header()..][..8].copy_from_slice(&1u64.to_le_bytes());
        region[layout.header() + 8..][..4].copy_from_slice(&opcode.0.to_le_bytes());
        for (k, word) in words.iter().enumerate() {
            region[layout.packet() + 8 * k..][..8].copy_from_slice(&word.to_le_bytes());
        }
        region[layout.packet() + 8..][..tail.len()].copy_from_slice(tail);
        region
    };
    let seed = |opcode: Opcode, words: &[u64], tail: &[u8]| {
        let mut bytes = vec![0u8]; // v1, L = 1, 1 port
        bytes.extend_from_slice(&region(opcode, words, tail));
        bytes
    };
    let mut both = vec![0u8];
    both.extend_from_slice(&region(Opcode::OPEN_FILE, &[6], b"a.txt\0"));
    both.extend_from_slice(&region(Opcode::MALLOC, &[4096], &[]));
    vec![
        seed(Opcode::TEST_INCREMENT, &[41], &[]),
        seed(Opcode::TEST_STREAM, &[20], b"twenty bytes of data"),
        seed(Opcode::PRINTF_TO_STDOUT, &[8], b"%s %d\n\0"),
        seed(Opcode::WRITE_TO_STDOUT, &[6], b"hello\n"),
        seed(Opcode::OPEN_FILE, &[6], b"a.txt\0"),
        seed(Opcode::REMOVE, &[10], b"../canary\0"),
        seed(Opcode::REMOVE, &[10], b"sub/b.txt\0"),
        seed(Opcode::MALLOC, &[4096], &[]),
        seed(Opcode::FREE, &[2 << 20], &[]),
        seed(Opcode::TEST_INTERFACE, &[1], &[]),
        seed(Opcode::EXIT, &[], &[]),
        seed(Opcode::READ_FROM_STREAM, &[100, 1], &[]),
        both,
    ]
}
