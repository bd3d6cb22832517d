//! Log lines a device causes are bounded, in number and in bytes (`Limits::device_log_lines`):
//! 300 unknown opcodes or 500 byte strings claimed above the bound are all counted, but only the
//! budget's lines per second reach the log, and what was dropped is told as a count; a refused
//! path of 4 MiB is quoted by a prefix and its length. Its own test binary: it installs a
//! logger that keeps every line, and each test reads those of its own server (by name).
#![cfg(not(loom))]

mod common;

use std::time::{Duration, Instant};

use common::{eventually, Device, Mailbox};
use rpc_core::protocol::ClientPort;
use rpc_core::{FilePolicy, Limits, Opcode, RpcServer, ServerConfig, ServicesConfig};

/// The lines a server named `name` logged (each begins with its name).
fn lines_of(name: &str) -> Vec<String> {
    let prefix = format!("{name}:");
    common::logged()
        .into_iter()
        .filter(|line| line.starts_with(&prefix))
        .collect()
}

/// The dropped lines the log told of: "(N similar line(s) dropped before this one)" and the
/// worker's "N device-caused log line(s) dropped", summed.
fn dropped_told(lines: &[String]) -> u64 {
    let number_before = |line: &str, marker: &str| -> Option<u64> {
        let head = &line[..line.find(marker)?];
        let digits = head
            .trim_end()
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()?;
        digits.parse().ok()
    };
    lines
        .iter()
        .map(|line| {
            number_before(line, " similar line(s) dropped before this one").unwrap_or(0)
                + number_before(line, " device-caused log line(s) dropped").unwrap_or(0)
        })
        .sum()
}

/// The budget of device-caused log lines per second the rate tests set.
const PER_SECOND: u32 = 5;

/// Asserts that `lines` lines of one kind, logged in `elapsed`, kept the budget of `windows`
/// one-second windows, and that the first window's lines were logged.
fn assert_within_budget(lines: u64, windows: u64, elapsed: Duration, logged: &[String]) {
    assert!(
        lines <= u64::from(PER_SECOND) * windows,
        "{lines} lines in {elapsed:?}: {logged:#?}"
    );
    assert!(lines >= u64::from(PER_SECOND), "the first lines are logged");
}

/// A running server with the given limits and files policy, one mailbox of `ports` ports of
/// one lane, and a user.
fn serve(name: &str, ports: u32, limits: Limits, files: FilePolicy) -> (RpcServer, Mailbox) {
    common::keep_log_lines(log::LevelFilter::Warn);
    let server = RpcServer::new(ServerConfig {
        name: name.into(),
        limits,
        services: ServicesConfig {
            files,
            ..ServicesConfig::default()
        },
        ..ServerConfig::default()
    });
    let mailbox = Mailbox::attach(&server, ports, 1);
    let _ = server.start().unwrap();
    (server, mailbox)
}

#[test]
fn device_caused_log_lines_are_rate_limited() {
    const REQUESTS: u64 = 300;
    let limits = Limits {
        device_log_lines: PER_SECOND,
        ..Limits::default()
    };
    let (server, mailbox) = serve("log-limit", 4, limits, FilePolicy::Deny);
    let _user = server.user();
    let deadline = common::hang_guard();
    let client = mailbox.client().with_wait(&deadline);
    let start = Instant::now();
    for i in 0..REQUESTS {
        let mut port = client.open(Opcode::user(0x7777), 1).unwrap();
        // Closed unanswered: the client reads its own request back.
        port.send_and_recv(|_, p| p.set_word(0, i), |_, p| assert_eq!(p.word(0), i))
            .unwrap();
    }
    eventually("every request served", || {
        server.stats().unknown >= REQUESTS
    });
    let elapsed = start.elapsed();
    // Every request is counted; the log got at most the budget of each one-second window the
    // run touched (a window starts at the first line after the previous one ended).
    assert_eq!(server.stats().unknown, REQUESTS);
    let windows = elapsed.as_secs() + 2;
    let logged = lines_of("log-limit");
    let lines = logged
        .iter()
        .filter(|l| l.contains("unknown opcode"))
        .count() as u64;
    assert_within_budget(lines, windows, elapsed, &logged);
    if lines < REQUESTS {
        // Lines were dropped: any window after the first reports them.
        assert!(
            lines <= u64::from(PER_SECOND)
                || logged.iter().any(|l| l.contains("dropped before this one"))
        );
    }
}

/// 500 byte strings claimed above the bound (WRITE_TO_STDOUT of 2^64-1 bytes, each on a port of its
/// own: a port whose exchange failed stays quarantined while its kernel runs) are all counted
/// in `errors`. They used to log 500 ERROR lines outside the budget; now the log gets at most
/// the budget's lines in each one-second window the burst touched, and every line that was
/// dropped is told as a count: by the next line logged, or by the worker when it stops.
#[test]
fn a_burst_of_over_long_claims_logs_the_budget_and_a_count_of_the_rest() {
    const CLAIMS: u64 = 500;
    let limits = Limits {
        device_log_lines: PER_SECOND,
        string_bytes: 1024,
        ..Limits::default()
    };
    let (server, mailbox) = serve("claims", CLAIMS as u32 + 4, limits, FilePolicy::Deny);
    server
        .context()
        .services()
        .set_stdout(Box::new(std::io::sink()));
    let user = server.user();
    let deadline = common::hang_guard();
    let client = mailbox.client().with_wait(&deadline);
    let start = Instant::now();
    for _ in 0..CLAIMS {
        let mut port = client.open(Opcode::WRITE_TO_STDOUT, 1).unwrap();
        // send_n's first packet: the length, far above the bound. No answer comes.
        port.send(|_, p| p.set_word(0, u64::MAX)).unwrap();
        drop(port);
    }
    eventually("every claim counted", || server.stats().errors >= CLAIMS);
    drop(user);
    let _ = server.shutdown().unwrap();
    let elapsed = start.elapsed();
    assert_eq!(server.stats().errors, CLAIMS);

    let logged = lines_of("claims");
    let claims = logged
        .iter()
        .filter(|l| l.contains("above the bound"))
        .count() as u64;
    // At most the budget in each window: a window lasts a second and begins at a line.
    let windows = elapsed.as_secs() + 1;
    assert_within_budget(claims, windows, elapsed, &logged);
    // Every claim is in the log: as its line, or in a count of dropped lines.
    assert_eq!(claims + dropped_told(&logged), CLAIMS, "{logged:#?}");
}

/// A refused path of 4 MiB used to be quoted whole and escaped, one line of megabytes per
/// request; now a line quotes a prefix of it and its length, and no line of the server is
/// longer than a few KiB (OPEN_FILE, REMOVE and RENAME, outside the sandbox).
#[test]
fn a_refused_four_mib_path_makes_a_short_log_line() {
    const PATH_BYTES: usize = 4 << 20;
    let sandbox = std::env::temp_dir().join(format!("rpc-log-limit-{}", std::process::id()));
    std::fs::create_dir_all(&sandbox).unwrap();
    let (server, mailbox) = serve(
        "long-path",
        1,
        Limits::default(),
        FilePolicy::Sandbox(sandbox.clone()),
    );
    let _user = server.user();
    let fx = Warp {
        mailbox,
        wait: common::EachWait::new(Duration::from_secs(120)),
    };
    let mut path = b"/etc/".to_vec();
    path.resize(PATH_BYTES, b'a');
    let mut c_path = path.clone();
    c_path.push(0);
    let paths = vec![c_path];
    assert_eq!(fx.fopen(&paths, "r")[0], 0);
    assert_eq!(fx.send_n_then_word(Opcode::REMOVE, &paths)[0], u64::MAX);
    assert_eq!(fx.rename(&paths, &paths)[0], u64::MAX);
    eventually("the three refused", || server.stats().refused >= 3);
    std::fs::remove_dir_all(&sandbox).unwrap();

    let logged = lines_of("long-path");
    let refusals: Vec<_> = logged.iter().filter(|l| l.contains("refused")).collect();
    assert_eq!(refusals.len(), 3, "{refusals:?}");
    for line in &logged {
        assert!(line.len() <= 4096, "a line of {} bytes", line.len());
    }
    for line in refusals {
        assert!(line.contains(&format!("({PATH_BYTES} bytes)")), "{line}");
        assert!(line.contains("\"/etc/aaaa"), "{line}");
    }
}

/// One warp of one lane on a mailbox of one port.
struct Warp {
    mailbox: Mailbox,
    wait: common::EachWait,
}

impl Device for Warp {
    fn open(&self, opcode: Opcode) -> ClientPort<'_> {
        self.mailbox.open(&self.wait, opcode, 1)
    }
}
