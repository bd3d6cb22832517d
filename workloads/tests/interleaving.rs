//! No exchange waits for another: the server thread interleaves every port, and blocking calls
//! run on the server's I/O threads. Each test is built so that the old run-to-completion server
//! could not pass it at all (it would wait forever and the test's bounded waits would fail), not
//! so that it passes only when fast enough: no assertion here is about time.

use std::ffi::CStr;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use plugin_host::kernel::{self, encode_printf, PrintfCall};
use plugin_host::{Arg, Target};
use rpc_core::protocol::{lanes, Backoff, Deadline, Wait};
use rpc_core::protocol::{Client, ClientPort, Generation, Layout, LockTable, MailboxMemory};
use rpc_core::AttachOptions;
use rpc_core::{
    ExitPolicy, MailboxId, Opcode, RpcServer, ServerConfig, ServicesConfig, StatsSnapshot,
};
use std::sync::atomic::Ordering;

#[path = "../../rpc-core/tests/common/capture.rs"]
mod capture;
use capture::Capture;

/// Generous liveness bound for a loaded 2-core machine (sanitizer builds included).
const BOUND: Duration = Duration::from_secs(60);

struct Fixture {
    server: RpcServer,
    memory: Arc<MailboxMemory>,
    id: MailboxId,
    locks: LockTable,
    out: Capture,
}

impl Fixture {
    fn new(name: &str, ports: u32, lanes: u32) -> Fixture {
        let _ = env_logger::builder().is_test(true).try_init();
        let server = RpcServer::new(ServerConfig {
            name: name.into(),
            services: ServicesConfig {
                exit: ExitPolicy::Record,
                ..ServicesConfig::default()
            },
            io_grace: Duration::from_millis(100),
            ..ServerConfig::default()
        });
        let out = Capture::default();
        server
            .context()
            .services()
            .set_stdout(Box::new(out.clone()));
        let memory = Arc::new(MailboxMemory::new(
            Layout::new(Generation::V2, ports, lanes).unwrap(),
        ));
        let id = server.attach(Box::new(memory.clone()), AttachOptions::default());
        let _ = server.start().unwrap();
        Fixture {
            server,
            memory,
            id,
            locks: LockTable::new(ports),
            out,
        }
    }

    /// Makes `stdin` the server's stdin.
    fn set_stdin(&self, stdin: impl std::io::Read + Send + 'static) {
        self.server.context().services().set_stdin(Box::new(stdin));
    }

    /// The statistics once every request sent so far is counted.
    fn settled_stats(&self) -> StatsSnapshot {
        workloads::settled_stats(&self.server, self.id)
    }

    fn client<'a>(&'a self, wait: &'a dyn Wait) -> Client<'a> {
        Client::new(self.memory.view(), self.locks.words())
            .unwrap()
            .with_wait(wait)
    }

    fn open<'a>(&'a self, wait: &'a dyn Wait, index: u32, op: Opcode, mask: u64) -> ClientPort<'a> {
        let client = self.client(wait);
        let deadline = Instant::now() + BOUND;
        loop {
            if let Some(port) = client.try_open_at(index, op, mask).unwrap() {
                return port;
            }
            assert!(Instant::now() < deadline, "port {index} never free");
            std::thread::yield_now();
        }
    }
}

fn increments(fixture: &Fixture, index: u32, count: u64) {
    let wait = Deadline::after(BOUND);
    for x in 0..count {
        let mut port = fixture.open(&wait, index, Opcode::TEST_INCREMENT, 1);
        let mut got = 0;
        port.send_and_recv(|_, p| p.set_word(0, x), |_, p| got = p.word(0))
            .unwrap();
        assert_eq!(got, x + 1);
    }
}

/// OPEN_FILE of `path` in `mode` (NUL-terminated) on port `index`: the handle (0: refused).
fn fopen(fixture: &Fixture, index: u32, path: &Path, mode: &[u8]) -> u64 {
    let wait = Deadline::after(BOUND);
    let mut port = fixture.open(&wait, index, Opcode::OPEN_FILE, 1);
    let mut name = path.as_os_str().as_encoded_bytes().to_vec();
    name.push(0);
    port.send_n(&[&name]).unwrap();
    let mut handle = u64::MAX;
    port.send_and_recv(|_, p| p.write_bytes(0, mode), |_, p| handle = p.word(0))
        .unwrap();
    handle
}

/// Sends `data` as `send_n` does, one packet at a time, calling `between` before each packet
/// after the first.
fn send_n_slowly(port: &mut ClientPort<'_>, data: &[u8], mut between: impl FnMut(usize)) {
    port.send(|_, p| {
        p.set_word(0, data.len() as u64);
        p.write_bytes(8, &data[..data.len().min(56)]);
    })
    .unwrap();
    for (k, chunk) in data.get(56..).unwrap_or_default().chunks(64).enumerate() {
        between(k);
        port.send(|_, p| p.write_bytes(0, chunk)).unwrap();
    }
}

/// Port 0 streams slowly (a packet every 50 ms, and its last packet only once port 1 is done):
/// port 1's 1000 TEST_INCREMENTs finish while port 0's exchange is still open.
#[test]
fn a_slow_client_does_not_hold_up_another_port() {
    let fixture = Fixture::new("slow", 2, 1);
    let _kernel = fixture.server.user();
    let done = AtomicBool::new(false);
    let data: Vec<u8> = (0..56 + 64 * 5).map(|i| i as u8).collect();
    std::thread::scope(|s| {
        let slow = s.spawn(|| {
            let wait = Deadline::after(BOUND);
            let mut port = fixture.open(&wait, 0, Opcode::TEST_STREAM, 1);
            let last = (data.len() - 56).div_ceil(64) - 1;
            send_n_slowly(&mut port, &data, |k| {
                std::thread::sleep(Duration::from_millis(50));
                if k == last {
                    let deadline = Instant::now() + BOUND;
                    while !done.load(Ordering::Acquire) {
                        assert!(Instant::now() < deadline, "port 1 never finished");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            });
            let back = port.recv_n(1 << 20).unwrap();
            assert_eq!(back[0], data);
        });
        increments(&fixture, 1, 1000);
        done.store(true, Ordering::Release);
        slow.join().unwrap();
    });
    let stats = fixture.settled_stats();
    assert_eq!(stats.served_of(Opcode::TEST_INCREMENT), 1000, "{stats}");
    assert_eq!(stats.served_of(Opcode::TEST_STREAM), 1, "{stats}");
}

/// A client wait that sleeps a little before each wait for the server: the client pauses
/// between its packets, as a slow device would.
struct Pausing(Deadline);

impl Wait for Pausing {
    fn pause(&self, port: u32, attempt: u32) -> Result<(), rpc_core::ProtocolError> {
        if attempt == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.0.pause(port, attempt)
    }
}

/// 64 ports at once, each a multi-packet printf (with a `%s` the server fetches) or a stream,
/// whose client pauses between its packets: every exchange completes, and the output is the
/// output of the same requests served one after another (the lines of each request whole).
#[test]
fn sixty_four_paused_exchanges_all_complete_with_the_sequential_output() {
    const PORTS: u32 = 64;
    let fixture = Fixture::new("sixty-four", PORTS, 32);
    let _kernel = fixture.server.user();
    let mask: u64 = 0x8000_0101;
    let text =
        |k: u32, l: u32| format!("request {k} lane {l} says {}", "x".repeat((k * 3) as usize));
    std::thread::scope(|s| {
        for k in 0..PORTS {
            let fixture = &fixture;
            s.spawn(move || {
                let wait = Pausing(Deadline::after(BOUND));
                let client = fixture.client(&wait);
                if k % 2 == 0 {
                    let data: Vec<Vec<u8>> =
                        (0..32).map(|l| text(k, l).repeat(4).into_bytes()).collect();
                    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
                    let mut port = client.open(Opcode::TEST_STREAM, mask).unwrap();
                    port.send_n(&slices).unwrap();
                    let back = port.recv_n(1 << 20).unwrap();
                    for l in lanes(mask) {
                        assert_eq!(back[l as usize], data[l as usize], "request {k} lane {l}");
                    }
                } else {
                    let lines: Vec<String> = (0..32).map(|l| text(k, l)).collect();
                    let calls: Vec<PrintfCall> = lines
                        .iter()
                        .map(|line| {
                            let arg = [Arg::Str(Some(line.as_str())), Arg::Int(k.into())];
                            encode_printf("[%s] %d\n", &arg, false)
                        })
                        .collect();
                    let printed =
                        kernel::printf(&client, mask, Target::Stdout, false, &calls).unwrap();
                    for l in lanes(mask) {
                        let want = format!("[{}] {k}\n", text(k, l));
                        assert_eq!(
                            printed[l as usize],
                            want.len() as i64,
                            "request {k} lane {l}"
                        );
                    }
                }
            });
        }
    });
    let mut expected: Vec<String> = Vec::new();
    for k in (1..PORTS).step_by(2) {
        let request: String = lanes(mask)
            .map(|l| format!("[{}] {k}\n", text(k, l)))
            .collect();
        expected.push(request);
    }
    // Each lane's output is written whole (with others' in one write); requests may interleave only
    // between whole lines.
    let out = String::from_utf8(fixture.out.bytes()).unwrap();
    let mut got: Vec<&str> = out.lines().collect();
    let mut want: Vec<&str> = expected.iter().flat_map(|r| r.lines()).collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want);
    let stats = fixture.settled_stats();
    assert_eq!(stats.total_served(), u64::from(PORTS), "{stats}");
    assert_eq!(stats.errors + stats.abandoned + stats.refused, 0, "{stats}");
}

/// A client wait that gives up once told to (the test ends the clients it left blocked), and
/// until then waits as `W` does (with a deadline, so that a test failing elsewhere ends instead
/// of waiting for it).
struct UntilTold<'a, W>(&'a AtomicBool, W);

impl<W: Wait> Wait for UntilTold<'_, W> {
    fn pause(&self, port: u32, attempt: u32) -> Result<(), rpc_core::ProtocolError> {
        if self.0.load(Ordering::Acquire) {
            return Err(rpc_core::ProtocolError::Abandoned {
                port,
                reason: "the test gave up",
            });
        }
        self.1.pause(port, attempt)
    }
}

/// How many of this process's threads named `name` sit in `openat` or `read` (x86-64 system
/// call numbers 257 and 0), as `/proc` shows them.
fn io_threads_blocked(name: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|task| {
            let read =
                |file: &str| std::fs::read_to_string(task.path().join(file)).unwrap_or_default();
            let syscall = read("syscall");
            let number = syscall.split(' ').next().unwrap_or("");
            read("comm").trim() == name && (number == "257" || number == "0")
        })
        .count()
}

/// A pty pair: the master and the slave's path.
fn open_pty() -> (std::fs::File, String) {
    // SAFETY: plain libc calls on a descriptor we own; ptsname_r writes into our buffer.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(master >= 0, "posix_openpt");
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(master, name.as_mut_ptr(), name.len()), 0);
        let path = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
        (std::os::fd::FromRawFd::from_raw_fd(master), path)
    }
}

/// A user opcode whose handler reads a pipe on an I/O thread (`Request::blocking`), as a
/// runtime's own blocking handler would: C send; S reads up to 64 bytes; S send buf[0] = bytes.
const READ_PIPE: Opcode = Opcode::user(7);

/// Three calls that block in the host's `read`: fgets on a stdin pipe held open without data,
/// and a user handler reading a pipe nobody writes, twice. They sit on the I/O threads, so the
/// other ports keep being served; shutdown returns anyway, abandoning the stuck threads. A FIFO
/// nobody writes and a pty nobody types into, which once blocked the same way, are refused at
/// once by the file policy (never opened).
#[test]
fn blocking_calls_block_only_their_own_ports_and_shutdown_still_returns() {
    let fixture = Fixture::new("blocking", 5, 1);
    let dir = std::env::temp_dir().join(format!("rpc-interleaving-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    let c_fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid path string.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
    let (stdin_read, stdin_write) = std::io::pipe().unwrap();
    fixture.set_stdin(stdin_read);
    let (pipe_read, pipe_write) = std::io::pipe().unwrap();
    let handler_end = Arc::new(pipe_read);
    fixture.server.register(READ_PIPE, move |mut req| {
        let end = handler_end.clone();
        async move {
            req.recv(|_, _| {}).await?;
            let got = req
                .blocking(move |_| {
                    let mut buf = [0u8; 64];
                    (&*end).read(&mut buf).unwrap_or(0)
                })
                .await?;
            req.send(|_, p| p.set_word(0, got as u64)).await
        }
    });
    let (_master, slave) = open_pty();
    let kernel = fixture.server.user();
    let give_up = AtomicBool::new(false);
    let wait = UntilTold(&give_up, Backoff);
    // The FIFO and the pty are answered, at once (a bounded wait that never gives up here
    // would have hung before), and with no file.
    assert_eq!(fopen(&fixture, 2, &fifo, b"r\0"), 0, "the FIFO is refused");
    assert_eq!(
        fopen(&fixture, 2, Path::new(&slave), b"r\0"),
        0,
        "the pty is refused"
    );
    let read_pipe = |index: u32| {
        let mut port = fixture.open(&wait, index, READ_PIPE, 1);
        port.send(|_, _| {}).unwrap();
        port.recv(|_, _| {}).is_err()
    };
    std::thread::scope(|s| {
        // Port 0: a handler reading the pipe.
        let pipe_first = s.spawn(|| read_pipe(0));
        // Port 1: fgets on stdin.
        let stdin_fgets = s.spawn(|| {
            let mut port = fixture.open(&wait, 1, Opcode::READ_FGETS, 1);
            port.send(|_, p| {
                p.set_word(0, 100);
                p.set_word(1, rpc_core::protocol::STDIN);
            })
            .unwrap();
            port.recv_n(1 << 20).is_err()
        });
        // Port 2: the same handler, on another I/O thread.
        let pipe_second = s.spawn(|| read_pipe(2));
        // Meanwhile ports 3 and 4 are served, until all three calls sit in `read` on I/O
        // threads.
        let deadline = Instant::now() + BOUND;
        while io_threads_blocked("rpc-blocking-io") < 3 {
            increments(&fixture, 3, 10);
            assert!(
                Instant::now() < deadline,
                "the blocking calls never started"
            );
        }
        increments(&fixture, 4, 100);
        // Shut down with the three calls stuck (and their kernel still running): it returns,
        // and says so; the three exchanges are left locked, never answered.
        let _ = fixture
            .server
            .shutdown_with(rpc_core::ShutdownPolicy::Force)
            .unwrap();
        let stats = fixture.server.stats();
        assert_eq!(stats.io_threads_abandoned, 3, "{stats}");
        assert_eq!(stats.abandoned, 3, "{stats}");
        give_up.store(true, Ordering::Release);
        for (name, client) in [
            ("pipe, port 0", pipe_first),
            ("stdin", stdin_fgets),
            ("pipe, port 2", pipe_second),
        ] {
            assert!(
                client.join().unwrap(),
                "{name}: the blocked request got no answer"
            );
        }
    });
    // Unblock the abandoned threads, so they leave: their pipes end.
    drop((stdin_write, pipe_write));
    // A restarted server serves again.
    drop(kernel);
    let _ = fixture.server.start().unwrap();
    let _kernel = fixture.server.user();
    increments(&fixture, 4, 10);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A stdin whose `read` tells the test it was entered, then blocks until the test lets it go
/// (and then reads as at the end of input).
struct GatedStdin {
    entered: std::sync::mpsc::Sender<()>,
    go: std::sync::mpsc::Receiver<()>,
}

impl Read for GatedStdin {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        let _ = self.entered.send(());
        let _ = self.go.recv_timeout(BOUND);
        Ok(0)
    }
}

/// While an fgets on stdin sits in the host's `read` (on an I/O thread, holding stdin), the
/// other stdin opcodes of other ports (CLEARERR, FEOF, FERROR, UNGETC) wait for stdin, never
/// on the server thread, and TEST_INCREMENTs on yet another port are served meanwhile.
/// (CLEARERR once cleared stdin's indicators on the server thread itself: it waited there for
/// the stdin lock, and with it every port of the server, until the read returned.)
#[test]
fn stdin_opcodes_behind_a_blocked_read_never_hold_the_server_thread() {
    let fixture = Fixture::new("stdin-blocked", 8, 1);
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    fixture.set_stdin(GatedStdin {
        entered: entered_tx,
        go: go_rx,
    });
    let _kernel = fixture.server.user();
    let wait = Deadline::after(BOUND);
    let stdin = rpc_core::protocol::STDIN;
    std::thread::scope(|s| {
        let fgets = s.spawn(|| {
            let mut port = fixture.open(&wait, 0, Opcode::READ_FGETS, 1);
            port.send(|_, p| {
                p.set_word(0, 100);
                p.set_word(1, stdin);
            })
            .unwrap();
            port.recv_n(1 << 20).unwrap()
        });
        entered
            .recv_timeout(BOUND)
            .expect("fgets reads stdin on an I/O thread");
        let others: Vec<_> = [
            (1, Opcode::CLEARERR, [stdin, 0]),
            (2, Opcode::FEOF, [stdin, 0]),
            (3, Opcode::FERROR, [stdin, 0]),
            (4, Opcode::UNGETC, [u64::from(b'x'), stdin]),
        ]
        .into_iter()
        .map(|(index, opcode, words)| {
            let mut port = fixture.open(&wait, index, opcode, 1);
            port.send(|_, p| {
                p.set_word(0, words[0]);
                p.set_word(1, words[1]);
            })
            .unwrap();
            s.spawn(move || {
                let mut reply = 0;
                port.recv(|_, p| reply = p.word(0)).unwrap();
                reply
            })
        })
        .collect();
        // Every pass now sees those four requests; the server thread must not wait for any.
        increments(&fixture, 5, 100);
        go.send(()).unwrap();
        assert_eq!(fgets.join().unwrap()[0], b"", "fgets at the end of input");
        let replies: Vec<u64> = others.into_iter().map(|h| h.join().unwrap()).collect();
        // CLEARERR sends its buffer back; UNGETC pushes back its byte whenever it runs.
        assert_eq!(replies[0], stdin, "CLEARERR");
        assert_eq!(replies[3], u64::from(b'x'), "UNGETC");
    });
}

/// More stdin reads than the server has I/O threads, all blocked (a stdin pipe held open
/// without data, as an interactive stdin nobody types into), and another port's OPEN_FILE and
/// FTELL, which need an I/O thread too, are still answered: stdin calls take their turn at
/// stdin one at a time, waiting suspended in their exchanges, not each on an I/O thread of its
/// own. (Each took a thread, and with all of them blocked in `read` or waiting for stdin's
/// lock no file call of any port was served until stdin had data: found by the adversarial
/// tests, whose leftover stdin reads of one case blocked on the next case's pipe.)
#[test]
fn stdin_reads_on_every_io_thread_do_not_hold_up_other_ports_files() {
    let fixture = Fixture::new("stdin-turns", 8, 1);
    let threads = ServerConfig::default().io_threads as u32;
    assert!(threads + 2 <= 8, "ports for the reads and the file");
    let (stdin_read, stdin_write) = std::io::pipe().unwrap();
    fixture.set_stdin(stdin_read);
    let _kernel = fixture.server.user();
    let wait = Deadline::after(BOUND);
    let stdin = rpc_core::protocol::STDIN;
    let dir = std::env::temp_dir().join(format!("rpc-stdin-turns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("f");
    std::thread::scope(|s| {
        let reads: Vec<_> = (0..=threads)
            .map(|index| {
                let mut port = fixture.open(&wait, index, Opcode::READ_FGETS, 1);
                port.send(|_, p| {
                    p.set_word(0, 100);
                    p.set_word(1, stdin);
                })
                .unwrap();
                s.spawn(move || port.recv_n(1 << 20).unwrap())
            })
            .collect();
        let index = threads + 1;
        let handle = fopen(&fixture, index, &path, b"w\0");
        assert_ne!(handle, 0, "OPEN_FILE answered while stdin blocks");
        let mut port = fixture.open(&wait, index, Opcode::FTELL, 1);
        let mut offset = u64::MAX;
        port.send_and_recv(|_, p| p.set_word(0, handle), |_, p| offset = p.word(0))
            .unwrap();
        assert_eq!(offset, 0, "FTELL answered while stdin blocks");
        drop(stdin_write);
        for read in reads {
            assert_eq!(read.join().unwrap()[0], b"", "fgets at the end of input");
        }
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Whether a thread of this process is named `name` (as the kernel shortens it: 15 bytes).
fn thread_named(name: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return false;
    };
    tasks.flatten().any(|task| {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        comm.trim() == name
    })
}

/// A request on port `index` that sends `data` to stdout (WRITE_TO_STDOUT) and leaves without
/// waiting for the reply, which a stdout nobody reads holds back; the port stays locked.
fn write_to_stdout_unanswered(fixture: &Fixture, index: u32, data: &[u8]) {
    let wait = Deadline::after(BOUND);
    let mut port = fixture.open(&wait, index, Opcode::WRITE_TO_STDOUT, 1);
    port.send_n(&[data]).unwrap();
    std::mem::forget(port);
}

/// Stdout is a pipe whose reader is alive but never reads. Port 0 writes 1 MiB to it (16
/// times the pipe's buffer) and port 2 prints a line behind it: neither is answered, and the
/// server thread never waits for them (it once sat in `write(2)`, and no port was served
/// again until someone read the pipe, nor did a shutdown return). Meanwhile 1000
/// TEST_INCREMENTs on port 1 and an OPEN_FILE on port 3 are answered; a shutdown then
/// returns, gives the unwritten bytes up and counts them; what did reach the pipe is the start
/// of port 0's bytes, in order.
#[test]
fn a_stdout_nobody_reads_holds_only_its_writers_and_shutdown_still_returns() {
    let fixture = Fixture::new("stuck-out", 4, 1);
    let (mut reader, writer) = std::io::pipe().unwrap();
    let services = fixture.server.context().services();
    services.set_stdout_fd(writer.into());
    let kernel = fixture.server.user();
    let blob: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    write_to_stdout_unanswered(&fixture, 0, &blob);
    let give_up = AtomicBool::new(false);
    let (done, shut) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let line = s.spawn(|| {
            let wait = UntilTold(&give_up, Deadline::after(BOUND));
            let client = fixture.client(&wait);
            let call = encode_printf("behind the blob\n", &[], false);
            kernel::printf(&client, 1, Target::Stdout, false, &[call]).is_err()
        });
        increments(&fixture, 1, 1000);
        let file = std::env::temp_dir().join(format!("rpc-stuck-out-{}", std::process::id()));
        std::fs::write(&file, b"x").unwrap();
        let handle = fopen(&fixture, 3, &file, b"r\0");
        assert_ne!(handle, 0, "OPEN_FILE answered with a file");
        std::fs::remove_file(&file).unwrap();
        // The shutdown runs on a thread of its own: a hang would fail the bound below.
        let server = &fixture.server;
        s.spawn(move || {
            let stopped = server.shutdown_with(rpc_core::ShutdownPolicy::Force);
            done.send(stopped.is_ok()).unwrap();
        });
        assert_eq!(
            shut.recv_timeout(BOUND),
            Ok(true),
            "shutdown never returned"
        );
        give_up.store(true, Ordering::Release);
        assert!(
            line.join().unwrap(),
            "the printf behind the blob got no answer"
        );
    });
    drop(kernel);
    let stats = fixture.server.stats();
    // The blob's bytes not in the pipe, and the line behind it.
    let lost = stats.output_lost_bytes;
    assert!(lost > 16, "{stats}");
    assert_eq!(stats.abandoned, 2, "{stats}");
    assert_eq!(stats.served_of(Opcode::TEST_INCREMENT), 1000, "{stats}");
    // Nothing more is written: the pipe holds the start of the blob, and nothing else.
    services.set_stdout(Box::new(std::io::sink()));
    let mut got = Vec::new();
    reader.read_to_end(&mut got).unwrap();
    assert_eq!(got.len() as u64 + lost, blob.len() as u64 + 16, "{stats}");
    assert_eq!(got, blob[..got.len()], "in order");
}

/// Stdout is a pipe nobody reads at first: port 0 writes 1 MiB, which waits in the stream's
/// queue; then three ports print numbered lines, one printf after another, and the reader
/// starts draining the pipe. Everything arrives: the blob first and whole, then each port's
/// lines in the order it printed them.
#[test]
fn output_queued_for_a_slow_reader_keeps_each_ports_order() {
    const LINES: u32 = 500;
    let fixture = Fixture::new("slow", 4, 1);
    let (mut reader, writer) = std::io::pipe().unwrap();
    let services = fixture.server.context().services();
    services.set_stdout_fd(writer.into());
    let _kernel = fixture.server.user();
    let blob: Vec<u8> = std::iter::repeat_n(b'b', 1 << 20).collect();
    let mut got = Vec::new();
    std::thread::scope(|s| {
        let fixture = &fixture;
        let blob = &blob;
        let blob_writer = s.spawn(move || {
            let wait = Deadline::after(BOUND);
            let mut port = fixture.open(&wait, 0, Opcode::WRITE_TO_STDOUT, 1);
            port.send_n(&[blob]).unwrap();
            let mut written = 0;
            port.recv(|_, p| written = p.word(0)).unwrap();
            assert_eq!(written, blob.len() as u64);
        });
        // The blob waits for the reader in the stream's queue, written by its drainer.
        let deadline = Instant::now() + BOUND;
        while !thread_named("rpc-slow-out") {
            assert!(Instant::now() < deadline, "stdout never filled up");
            std::thread::sleep(Duration::from_millis(1));
        }
        let printers: Vec<_> = (1..4u32)
            .map(|index| {
                s.spawn(move || {
                    let wait = Deadline::after(BOUND);
                    let client = fixture.client(&wait);
                    for k in 0..LINES {
                        let args = [Arg::Int(index.into()), Arg::Int(k.into())];
                        let call = encode_printf("port %d line %d\n", &args, false);
                        let printed =
                            kernel::printf(&client, 1, Target::Stdout, false, &[call]).unwrap();
                        assert!(printed[0] > 0, "port {index} line {k}");
                    }
                })
            })
            .collect();
        let reading = s.spawn(|| reader.read_to_end(&mut got).unwrap());
        blob_writer.join().unwrap();
        for printer in printers {
            printer.join().unwrap();
        }
        // Every request answered: the writer goes, and the pipe ends.
        services.set_stdout(Box::new(std::io::sink()));
        reading.join().unwrap();
    });
    assert_eq!(got[..blob.len()], blob[..], "the blob first, whole");
    let text = String::from_utf8(got[blob.len()..].to_vec()).unwrap();
    let mut next = [0u32; 4];
    for line in text.lines() {
        let mut words = line.split(' ').skip(1).step_by(2);
        let index: usize = words.next().unwrap().parse().unwrap();
        let k: u32 = words.next().unwrap().parse().unwrap();
        assert_eq!(k, next[index], "port {index}'s lines in order");
        next[index] += 1;
    }
    assert_eq!(next[1..], [LINES; 3]);
    let stats = fixture.server.stats();
    assert_eq!(stats.output_lost_bytes, 0, "{stats}");
}
