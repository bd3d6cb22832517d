//! Log lines a device causes are rate-limited (`Limits::device_log_lines`): 300 unknown
//! opcodes are all counted, but only a few lines per second reach the log, and a line logged
//! after some were dropped says how many. Its own test binary: it installs a counting logger.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_core::protocol::Deadline;
use rpc_core::protocol::{Client, Generation, Layout, LockTable, MailboxMemory};
use rpc_core::{Limits, Opcode, RpcServer, ServerConfig};

static UNKNOWN_LINES: AtomicUsize = AtomicUsize::new(0);
static DROP_REPORTS: AtomicUsize = AtomicUsize::new(0);

struct Counting;

impl log::Log for Counting {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let text = record.args().to_string();
        if text.contains("unknown opcode") {
            UNKNOWN_LINES.fetch_add(1, Ordering::Relaxed);
        }
        if text.contains("dropped before this one") {
            DROP_REPORTS.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn flush(&self) {}
}

#[test]
fn device_caused_log_lines_are_rate_limited() {
    log::set_logger(&Counting).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    const PER_SECOND: u32 = 5;
    const REQUESTS: u64 = 300;
    let server = RpcServer::new(ServerConfig {
        name: "log-limit".into(),
        limits: Limits {
            device_log_lines: PER_SECOND,
            ..Limits::default()
        },
        ..ServerConfig::default()
    });
    let memory = Arc::new(MailboxMemory::new(
        Layout::new(Generation::V1, 4, 1).unwrap(),
    ));
    server.attach(Box::new(memory.clone()));
    let _ = server.start().unwrap();
    let _user = server.user();
    let locks = LockTable::new(4);
    let deadline = Deadline::after(Duration::from_secs(120));
    let client = Client::new(memory.view(), locks.words())
        .unwrap()
        .with_wait(&deadline);
    let start = Instant::now();
    for i in 0..REQUESTS {
        let mut port = client.open(Opcode::user(0x7777), 1).unwrap();
        // Closed unanswered: the client reads its own request back.
        port.send_and_recv(|_, p| p.set_word(0, i), |_, p| assert_eq!(p.word(0), i))
            .unwrap();
    }
    while server.stats().unknown < REQUESTS {
        assert!(start.elapsed() < Duration::from_secs(60), "not all served");
        std::thread::yield_now();
    }
    let elapsed = start.elapsed();
    // Every request is counted; the log got at most the budget of each one-second window the
    // run touched (a window starts at the first line after the previous one ended).
    assert_eq!(server.stats().unknown, REQUESTS);
    let windows = elapsed.as_secs() + 2;
    let lines = UNKNOWN_LINES.load(Ordering::Relaxed) as u64;
    assert!(
        lines <= u64::from(PER_SECOND) * windows,
        "{lines} lines in {elapsed:?}"
    );
    assert!(lines >= u64::from(PER_SECOND), "the first lines are logged");
    if lines < REQUESTS {
        // Lines were dropped: any window after the first reports them.
        assert!(lines <= u64::from(PER_SECOND) || DROP_REPORTS.load(Ordering::Relaxed) > 0);
    }
}
