//! No plugin code and no log line runs under the server thread's control lock: a logger and a
//! doorbell that call back into the server (each call takes that lock) do not deadlock it.
//! Its own test binary: it installs a logger. A deadlock shows as a liveness bound running out
//! (60 s, far beyond what either test needs), never as a timing assertion.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::thread;
use std::time::{Duration, Instant};

use rpc_core::plugin::Doorbell;
use rpc_core::protocol::{Generation, Layout, MailboxMemory};
use rpc_core::AttachOptions;
use rpc_core::{RpcServer, ServerConfig, ShutdownPolicy, Stopped};

/// The server the logger asks for its users on every line it gets.
static ASKED: Mutex<Option<Weak<RpcServer>>> = Mutex::new(None);
static FORCED_LINES: AtomicUsize = AtomicUsize::new(0);
static STATS_LINES: AtomicUsize = AtomicUsize::new(0);

struct CallingBack;

impl log::Log for CallingBack {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let server = ASKED.lock().unwrap().as_ref().and_then(Weak::upgrade);
        let Some(server) = server else {
            return;
        };
        // Takes the control lock: deadlocks if this line is logged under it.
        let _ = server.users();
        let text = record.args().to_string();
        if text.contains("kernel(s) still running") {
            FORCED_LINES.fetch_add(1, Ordering::Relaxed);
        }
        if text.contains("server statistics") {
            STATS_LINES.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn flush(&self) {}
}

/// Runs `body` on a thread of its own and fails if it does not finish within the bound.
fn within_bound(what: &str, body: impl FnOnce() + Send + 'static) {
    let (done, finished) = mpsc::channel();
    let runner = thread::spawn(move || {
        body();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => runner.join().unwrap(),
        // The body panicked: report its panic.
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(runner.join().expect_err("the body ended without finishing"))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: deadlocked"),
    }
}

#[test]
fn a_logger_calling_back_into_the_server_does_not_deadlock_a_forced_shutdown() {
    log::set_logger(&CallingBack).unwrap();
    log::set_max_level(log::LevelFilter::Info);
    within_bound("forced shutdown with a logger calling back", || {
        let server = Arc::new(RpcServer::new(ServerConfig {
            name: "logger".into(),
            log_stats_on_shutdown: true,
            ..ServerConfig::default()
        }));
        *ASKED.lock().unwrap() = Some(Arc::downgrade(&server));
        let _ = server.start().unwrap();
        let kernel = server.user();
        // Logs that a kernel is left running, and the statistics: both after the lock.
        assert_eq!(
            server.shutdown_with(ShutdownPolicy::Force),
            Ok(Stopped::Stopped)
        );
        *ASKED.lock().unwrap() = None;
        drop(kernel);
    });
    assert_eq!(FORCED_LINES.load(Ordering::Relaxed), 1);
    assert_eq!(STATS_LINES.load(Ordering::Relaxed), 1);
}

/// A doorbell that asks its server whether it runs each time the server looks at its counter
/// (to know whether to sleep on it), and whose interrupt never comes (`wait` times out at once).
struct AskingDoorbell {
    counter: AtomicU64,
    server: OnceLock<Weak<RpcServer>>,
    asked: Arc<AtomicUsize>,
}

impl Doorbell for AskingDoorbell {
    fn record(&self) -> [u8; 64] {
        [0; 64]
    }
    fn counter(&self) -> &std::sync::atomic::AtomicU64 {
        if let Some(server) = self.server.get().and_then(Weak::upgrade) {
            // Takes the control lock: deadlocks if the counter is read under it.
            let _ = server.is_running();
            self.asked.fetch_add(1, Ordering::Relaxed);
        }
        &self.counter
    }
    fn wait(&self, _timeout: Duration) -> bool {
        false
    }
}

#[test]
fn a_doorbell_calling_back_into_the_server_does_not_deadlock_the_worker() {
    within_bound("the worker parking on a doorbell that calls back", || {
        let server = Arc::new(RpcServer::new(ServerConfig {
            name: "doorbell".into(),
            ..ServerConfig::default()
        }));
        let asked = Arc::new(AtomicUsize::new(0));
        let bell = AskingDoorbell {
            counter: AtomicU64::new(0),
            server: OnceLock::new(),
            asked: asked.clone(),
        };
        let _ = bell.server.set(Arc::downgrade(&server));
        let memory = MailboxMemory::new(Layout::new(Generation::V2, 1, 1).unwrap());
        let _id = server.attach(
            Box::new(memory),
            AttachOptions::default().doorbell(Box::new(bell)),
        );
        let _ = server.start().unwrap();
        // With a user and no request, the worker backs off and then looks whether it can sleep
        // on the doorbell (its counter 0), again and again.
        let kernel = server.user();
        let bound = Instant::now() + Duration::from_secs(50);
        while server.stats().doorbell_sleeps < 3 {
            assert!(
                Instant::now() < bound,
                "the worker never slept on the doorbell"
            );
            thread::yield_now();
        }
        assert!(asked.load(Ordering::Relaxed) >= 3);
        drop(kernel);
        assert_eq!(server.shutdown(), Ok(Stopped::Stopped));
    });
}
