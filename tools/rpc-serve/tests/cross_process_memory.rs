//! What one request can make `rpc-serve` hold, measured from outside: each attack runs against
//! a fresh rpc-serve, and its peak resident memory (`VmHWM` in `/proc/PID/status`) stays far
//! below what the attack used to cost.
//! - printf of `"%4096d"` x 100000: 400 MB of output, which used to be built whole in memory;
//! - `%s` x 300 on one 1 MiB string: fetched 300 times and printed into one buffer before;
//! - READ_FROM_STREAM of a stdin that is `/dev/zero` with a count of 2^62: served in a part of
//!   `Limits::read_bytes`;
//! - 20000 unknown opcodes: counted, but only a few log lines per second;
//! - 9600 MALLOC(1): each held a 2 MiB-aligned block (+20 GB of address space), now they
//!   share one slab.

mod common;

use std::process::Stdio;
use std::time::Instant;

use common::{layout, serve, serve_with_stdin, Serve, BOUND, PORTS};
use plugin_host::kernel::STDIN;
use plugin_host::{Arg, Warp};
use rpc_core::protocol::Deadline;
use rpc_core::protocol::LockTable;
use rpc_core::Opcode;

/// Peak resident memory of rpc-serve so far, in bytes.
fn peak_rss(serve: &Serve) -> u64 {
    status_bytes(serve, "VmHWM:")
}

/// A memory figure of rpc-serve's `/proc/PID/status` (`VmHWM:`, `VmSize:`, ...), in bytes.
fn status_bytes(serve: &Serve, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", serve.child.0.id())).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .expect("the field");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

/// Far below each attack's old cost (hundreds of MB), far above rpc-serve's own needs.
const PEAK: u64 = 96 << 20;

/// Checks that `serve`'s peak RSS stayed below [`PEAK`], and stops it.
fn stop_below_peak(serve: Serve) {
    let peak = peak_rss(&serve);
    eprintln!("rpc-serve peak RSS: {} KiB", peak >> 10);
    assert!(peak < PEAK, "peak RSS {peak} bytes");
    serve.stop();
}

/// Runs `f` with a one-lane warp of a client of `serve`'s mailbox.
fn with_warp<R>(serve: &Serve, f: impl FnOnce(&Warp) -> R) -> R {
    let map = common::map(&serve.path);
    let locks = LockTable::new(PORTS);
    let wait = Deadline::after(BOUND);
    f(&common::warp(&map, layout(), &locks, Some(&wait), 1))
}

/// rpc-serve with the device's stdout thrown away, and its default client timeout: formatting
/// 400 MB may take longer than that on a loaded machine, which must not count as the client's
/// silence (it once did: the printf read 0 back).
fn quiet_serve() -> Serve {
    serve(&["--stdout", "/dev/null"], None)
}

#[test]
fn a_printf_of_400_mb_never_holds_its_output() {
    const SPECS: usize = 100_000;
    let serve = quiet_serve();
    let format = "%4096d".repeat(SPECS);
    let printed = with_warp(&serve, |warp| {
        warp.printf(&format, |_| vec![Arg::Int(7); SPECS])
    })
    .unwrap();
    assert_eq!(printed[0], (4096 * SPECS) as i64);
    stop_below_peak(serve);
}

#[test]
fn a_string_printed_300_times_is_fetched_once_and_never_held_whole() {
    let serve = quiet_serve();
    let text = "s".repeat(1 << 20);
    let printed = with_warp(&serve, |warp| {
        warp.printf(&"%s".repeat(300), |_| vec![Arg::Str(Some(&text)); 300])
    })
    .unwrap();
    assert_eq!(printed[0], 300 << 20);
    stop_below_peak(serve);
}

#[test]
fn a_read_of_2_pow_62_bytes_from_dev_zero_is_served_in_a_part() {
    let zero = std::fs::File::open("/dev/zero").unwrap();
    let serve = serve_with_stdin(&[], None, Stdio::from(zero));
    let data = with_warp(&serve, |warp| warp.fread(|_| STDIN, 1 << 62)).unwrap();
    assert_eq!(
        data[0].len(),
        rpc_core::Limits::default().read_bytes as usize
    );
    assert!(data[0].iter().all(|&b| b == 0));
    stop_below_peak(serve);
}

#[test]
fn twenty_thousand_unknown_opcodes_write_a_few_log_lines() {
    const REQUESTS: u64 = 20_000;
    let serve = quiet_serve();
    let start = Instant::now();
    with_warp(&serve, |warp| {
        for i in 0..REQUESTS {
            // Closed unanswered: the client reads its own request back.
            assert_eq!(warp.call(Opcode::user(0x7777), |_| i).unwrap()[0], i);
        }
    });
    let elapsed = start.elapsed();
    let (rest, log) = serve.stop();
    assert!(rest.contains(&format!("unknown={REQUESTS}")), "{rest}");
    let lines = log.iter().filter(|l| l.contains("unknown opcode")).count() as u64;
    // At most the budget of each one-second window the run touched.
    let budget = u64::from(rpc_core::Limits::default().device_log_lines) * (elapsed.as_secs() + 2);
    assert!(lines <= budget, "{lines} log lines in {elapsed:?}");
    assert!(
        log.iter().any(|l| l.contains("dropped before this one")) || lines < 40,
        "a later line reports the dropped ones"
    );
}

/// rpc-serve serves MALLOC and FREE from its own memory: aligned to the size (2 MiB above
/// `SMALL_MAX`), at most 1 GiB live.
#[test]
fn malloc_and_free_are_served_aligned_and_capped() {
    let serve = quiet_serve();
    with_warp(&serve, |warp| {
        let addr = warp.malloc(|_| 100).unwrap()[0];
        assert_ne!(addr, 0);
        assert_eq!(addr % 128, 0);
        let block = warp.malloc(|_| 2 << 20).unwrap()[0];
        assert_eq!(block % rpc_core::services::MALLOC_ALIGN, 0);
        warp.free(|_| block).unwrap();
        assert_eq!(warp.malloc(|_| 2 << 30).unwrap()[0], 0, "above the cap");
        warp.free(|_| addr).unwrap();
    });
    let (rest, _) = serve.stop();
    assert!(rest.contains("refused=1"), "{rest}");
}

/// 9600 MALLOC(1) share one slab of 2 MiB: rpc-serve's address space (`VmSize`, less room for
/// a new thread's arena) and resident memory grow by a few MiB (before, each took a block of 4 MiB: +20 GB of address space and
/// hundreds of MB resident, while the quota had counted 9600 bytes). Then each is freed.
#[test]
fn mallocs_of_one_byte_share_a_slab_and_take_no_address_space_each() {
    const MALLOCS: usize = 9600;
    let serve = quiet_serve();
    let (size, rss) = (
        status_bytes(&serve, "VmSize:"),
        status_bytes(&serve, "VmRSS:"),
    );
    let addrs = with_warp(&serve, |warp| {
        let addrs: Vec<u64> = (0..MALLOCS)
            .map(|_| warp.malloc(|_| 1).unwrap()[0])
            .collect();
        let grown = status_bytes(&serve, "VmSize:").saturating_sub(size);
        let resident = status_bytes(&serve, "VmRSS:").saturating_sub(rss);
        eprintln!(
            "rpc-serve grew by {} KiB, {} KiB resident",
            grown >> 10,
            resident >> 10
        );
        // The slab's 2 MiB, and room for one thread that may start meanwhile (an I/O or an
        // output thread: glibc reserves a 64 MiB arena for a new thread's malloc; one run here
        // grew by 69,218,304 bytes, exactly that and the slab); one block each would be 20 GB.
        assert!(grown < 128 << 20, "address space +{grown} bytes");
        assert!(resident < 32 << 20, "resident +{resident} bytes");
        for &addr in &addrs {
            warp.free(|_| addr).unwrap();
        }
        addrs
    });
    assert!(addrs.iter().all(|&a| a != 0 && a % 16 == 0));
    let distinct: std::collections::BTreeSet<_> = addrs.iter().collect();
    assert_eq!(distinct.len(), MALLOCS);
    let (rest, _) = serve.stop();
    assert!(rest.contains("refused=0"), "{rest}");
}

/// `--held-mib 1`: a 2 MiB write (within the 64 MiB stream bound) is more than every client
/// together may make rpc-serve hold, so it is received, dropped and answered 0; a 512 KiB
/// write after it is served whole.
#[test]
fn held_mib_bounds_what_the_clients_make_rpc_serve_hold() {
    let serve = serve(&["--stdout", "/dev/null", "--held-mib", "1"], None);
    let written = with_warp(&serve, |warp| {
        [2 << 20, 512 << 10].map(|len| {
            warp.write(plugin_host::kernel::Target::Stdout, |_| vec![b'x'; len])
                .unwrap()[0]
        })
    });
    assert_eq!(written, [0, 512 << 10]);
    let (rest, _) = serve.stop();
    assert!(rest.contains("refused=1"), "{rest}");
}
