//! The soak behind `cargo xtask soak --seconds S`: two plugin-host runtimes (L = 32 on a v2
//! mailbox, L = 64 on a v1 one), each with its own server, run rounds of kernels with mixed
//! traffic until S seconds have passed: printf, TEST_STREAM of random lengths, files in a
//! temporary directory (write, read back, close), malloc/free, a custom opcode registered per
//! plugin (each plugin answers its own way), and a few deliberately bad requests (a bogus
//! stream handle, a bogus FREE, a path outside the allowed directory, an unknown opcode, a
//! kernel that calls `exit`).
//!
//! Every request sent is counted, and so is every answer checked correct (a bad request's
//! answer is correct when it is the documented error value). The report:
//! - `requests`: requests sent; `answered`: those answered correctly;
//! - `lost`: requests without a correct answer, plus printf output bytes that never arrived;
//! - `errors_expected`: the deliberately bad requests (each also answered);
//! - `errors_unexpected`: calls that failed, server counters off from what was sent (panics,
//!   handler errors, refusals and unknown opcodes beyond the deliberate ones);
//! - `leaked`: open files + live allocations + live workers after `deinit`.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plugin_host::kernel::{STDIN, STDOUT};
use plugin_host::{Arg, HostConfig, HostImage, HostPlugin, Target, Warp};
use rpc_core::plugin::Grid;
use rpc_core::protocol::Generation;
use rpc_core::services::malloc_alignment;
use rpc_core::FilePolicy;
use rpc_core::KernelExit;
use rpc_core::PluginRuntime;
use rpc_core::{Error, ExitPolicy, Opcode, PluginError, ServerConfig, ServicesConfig};

/// The custom opcode both plugins register, each with its own answer.
pub const CUSTOM: Opcode = Opcode::user(100);
/// An opcode no handler accepts.
const UNKNOWN: Opcode = Opcode(0x7A7A_0001);
/// The answer of C's EOF / -1 as a reply word.
const EOF: u64 = u64::MAX;
/// Iterations of the mixed loop per warp per launch.
const ITERATIONS: u32 = 6;

/// The soak's tallies (shared by every warp of every runtime).
#[derive(Default)]
pub struct Counters {
    requests: AtomicU64,
    answered: AtomicU64,
    errors_expected: AtomicU64,
    errors_unexpected: AtomicU64,
    /// Deliberate requests the server counts as refused / unknown.
    refused_sent: AtomicU64,
    unknown_sent: AtomicU64,
    /// Bytes printf and puts said they wrote to stdout.
    printed: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    /// One request: answered correctly or not.
    fn request(&self, correct: bool) {
        add(&self.requests, 1);
        if correct {
            add(&self.answered, 1);
        }
    }
    /// One request whose call failed outright.
    fn failed(&self, what: &str, error: &Error) {
        add(&self.requests, 1);
        add(&self.errors_unexpected, 1);
        eprintln!("soak: {what} failed: {error}");
    }
    /// One deliberately bad request, answered with `correct` telling whether the error value
    /// was the documented one.
    fn bad(&self, correct: bool) {
        self.request(correct);
        add(&self.errors_expected, 1);
    }
}

/// The final line's numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub requests: u64,
    pub answered: u64,
    pub lost: u64,
    pub errors_expected: u64,
    pub errors_unexpected: u64,
    pub leaked: u64,
}

impl Report {
    /// True if nothing was lost, nothing failed unexpectedly and nothing leaked.
    pub fn clean(&self) -> bool {
        self.lost == 0 && self.errors_unexpected == 0 && self.leaked == 0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "requests={} answered={} lost={} errors_expected={} errors_unexpected={} leaked={}",
            self.requests,
            self.answered,
            self.lost,
            self.errors_expected,
            self.errors_unexpected,
            self.leaked
        )
    }
}

/// A writer that only counts bytes.
#[derive(Clone, Default)]
struct CountingSink(Arc<AtomicU64>);

impl Write for CountingSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        add(&self.0, buf.len() as u64);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A small xorshift generator: each warp's traffic differs, and is reproducible per seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a kernel needs besides its warp.
struct Soak {
    counters: Arc<Counters>,
    dir: PathBuf,
    /// The custom opcode's answer on this plugin.
    custom: fn(u64) -> u64,
    tag: &'static str,
}

fn lanes_ok(warp: &Warp<'_>, got: &[u64], expected: impl Fn(u32) -> u64) -> bool {
    warp.lanes().all(|l| got[l as usize] == expected(l))
}

impl Soak {
    fn printf(&self, warp: &Warp<'_>, rng: &mut Rng) {
        let n = rng.below(1000) as i64;
        let text = ["short", "a somewhat longer string that takes packets", ""];
        let s = text[rng.below(3) as usize];
        let result = warp.printf("soak %s %d %5.1f %s|\n", |l| {
            vec![
                Arg::Str(Some(self.tag)),
                Arg::Int(n + i64::from(l)),
                Arg::Double(f64::from(l) / 4.0),
                Arg::Str(Some(s)),
            ]
        });
        match result {
            Ok(got) => {
                let expected = |l: u32| {
                    format!(
                        "soak {} {} {:5.1} {s}|\n",
                        self.tag,
                        n + i64::from(l),
                        f64::from(l) / 4.0
                    )
                    .len() as i64
                };
                let ok = warp.lanes().all(|l| got[l as usize] == expected(l));
                if ok {
                    let bytes: i64 = warp.lanes().map(expected).sum();
                    add(&self.counters.printed, bytes as u64);
                }
                self.counters.request(ok);
            }
            Err(error) => self.counters.failed("printf", &error),
        }
    }

    fn stream(&self, warp: &Warp<'_>, rng: &mut Rng) {
        let seed = rng.next();
        let data: Vec<Vec<u8>> = (0..64u64)
            .map(|l| {
                let len = (seed.rotate_left(l as u32) % 3000) as usize;
                (0..len).map(|i| (i as u64 ^ l ^ seed) as u8).collect()
            })
            .collect();
        let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let result = warp.open(Opcode::TEST_STREAM).and_then(|mut port| {
            port.send_n(&slices)?;
            Ok(port.recv_n(1 << 20)?)
        });
        match result {
            Ok(back) => self
                .counters
                .request(warp.lanes().all(|l| back[l as usize] == data[l as usize])),
            Err(error) => self.counters.failed("TEST_STREAM", &error),
        }
    }

    /// fopen "w+" per lane, write, fclose; fopen "r", fread, fclose: five requests.
    fn files(&self, warp: &Warp<'_>, rng: &mut Rng) {
        let round = rng.next();
        let path = |l: u32| {
            self.dir
                .join(format!("{}-{}-{l}", self.tag, warp.global_warp()))
                .to_string_lossy()
                .into_owned()
        };
        let content = |l: u32| format!("lane {l} round {round}\n").into_bytes();
        let counters = &self.counters;
        let run = || -> Result<(), Error> {
            let handles = warp.fopen(path, "w+")?;
            let opened = warp.lanes().all(|l| handles[l as usize] != 0);
            counters.request(opened);
            if !opened {
                return Ok(());
            }
            // WRITE_TO_STREAM takes one handle per warp: every lane's text goes, in lane order,
            // to the first lane's file.
            let first = warp.lanes().next().unwrap_or(0);
            let written = warp.write(Target::File(handles[first as usize]), content)?;
            counters.request(lanes_ok(warp, &written, |l| content(l).len() as u64));
            let closed = warp.fclose(|l| handles[l as usize])?;
            counters.request(lanes_ok(warp, &closed, |_| 0));
            let handles = warp.fopen(path, "r")?;
            let opened = warp.lanes().all(|l| handles[l as usize] != 0);
            counters.request(opened);
            if !opened {
                return Ok(());
            }
            let read = warp.fread(|l| handles[l as usize], 4000)?;
            let all: Vec<u8> = warp.lanes().flat_map(content).collect();
            let ok = warp.lanes().all(|l| {
                let expected: &[u8] = if l == first { &all } else { &[] };
                read[l as usize] == expected
            });
            counters.request(ok);
            let closed = warp.fclose(|l| handles[l as usize])?;
            counters.request(lanes_ok(warp, &closed, |_| 0));
            Ok(())
        };
        if let Err(error) = run() {
            self.counters.failed("files", &error);
        }
    }

    fn memory(&self, warp: &Warp<'_>, rng: &mut Rng) {
        let size = 1 + rng.below(1 << 16);
        match warp.malloc(|l| size + u64::from(l)) {
            Ok(addrs) => {
                let ok = warp.lanes().all(|l| {
                    let addr = addrs[l as usize];
                    addr != 0 && addr % malloc_alignment(size + u64::from(l)) == 0
                });
                self.counters.request(ok);
                match warp.free(|l| addrs[l as usize]) {
                    Ok(()) => self.counters.request(true),
                    Err(error) => self.counters.failed("free", &error),
                }
            }
            Err(error) => self.counters.failed("malloc", &error),
        }
    }

    fn custom(&self, warp: &Warp<'_>, rng: &mut Rng) {
        let x = rng.below(1 << 40);
        match warp.call(CUSTOM, |l| x + u64::from(l)) {
            Ok(got) => self
                .counters
                .request(lanes_ok(warp, &got, |l| (self.custom)(x + u64::from(l)))),
            Err(error) => self.counters.failed("custom opcode", &error),
        }
    }

    /// The deliberately bad requests, one of them per call.
    fn bad(&self, warp: &Warp<'_>, rng: &mut Rng) {
        let counters = &self.counters;
        match rng.below(4) {
            0 => match warp.fclose(|l| 0xDEAD_0000 + (u64::from(l) << 2)) {
                // A bogus handle: EOF, and refused on the host.
                Ok(got) => {
                    add(&counters.refused_sent, 1);
                    counters.bad(lanes_ok(warp, &got, |_| EOF));
                }
                Err(error) => counters.failed("fclose of a bogus handle", &error),
            },
            1 => match warp.free(|l| 0x1000 + u64::from(l)) {
                // Not a live allocation: refused, nothing freed, no reply.
                Ok(()) => {
                    add(&counters.refused_sent, 1);
                    counters.bad(true);
                }
                Err(error) => counters.failed("free of a bogus pointer", &error),
            },
            2 => match warp.fopen(|_| "/etc/hostname".into(), "r") {
                // Outside the allowed directory: handle 0.
                Ok(got) => {
                    add(&counters.refused_sent, 1);
                    counters.bad(lanes_ok(warp, &got, |_| 0));
                }
                Err(error) => counters.failed("fopen outside the directory", &error),
            },
            _ => match warp.call(UNKNOWN, |l| 7 + u64::from(l)) {
                // No handler: the port is closed unanswered and the request comes back.
                Ok(got) => {
                    add(&counters.unknown_sent, 1);
                    counters.bad(lanes_ok(warp, &got, |l| 7 + u64::from(l)));
                }
                Err(error) => counters.failed("unknown opcode", &error),
            },
        }
    }

    fn mix(&self, warp: &Warp<'_>) {
        let seed = warp
            .args()
            .get(..8)
            .map_or(1, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        let mut rng = Rng(seed ^ (u64::from(warp.global_warp()) + 1).wrapping_mul(0x9E37_79B9));
        for _ in 0..ITERATIONS {
            match rng.below(10) {
                0 | 1 => self.printf(warp, &mut rng),
                2 | 3 => self.stream(warp, &mut rng),
                4 => self.files(warp, &mut rng),
                5 | 6 => self.memory(warp, &mut rng),
                7 | 8 => self.custom(warp, &mut rng),
                _ => self.bad(warp, &mut rng),
            }
        }
        // A read of stdin that returns nothing (the runtime's stdin is empty): answered with 0
        // bytes, not an error.
        match warp.fread(|_| STDIN, 0) {
            Ok(read) => self
                .counters
                .request(warp.lanes().all(|l| read[l as usize].is_empty())),
            Err(error) => self.counters.failed("fread of stdin", &error),
        }
        let _ = STDOUT;
    }
}

/// One plugin-host runtime of the soak.
struct Runtime {
    runtime: PluginRuntime<HostPlugin>,
    image: rpc_core::ImageId,
    out: CountingSink,
    grid: Grid,
    name: &'static str,
}

fn runtime(
    name: &'static str,
    lanes: u32,
    generation: Generation,
    custom: fn(u64) -> u64,
    counters: &Arc<Counters>,
    dir: &Path,
) -> Result<Runtime, String> {
    let config = ServerConfig {
        name: name.into(),
        limits: rpc_core::Limits {
            string_bytes: 1 << 20,
            open_files: 1024,
            ..rpc_core::Limits::default()
        },
        services: ServicesConfig {
            exit: ExitPolicy::Record,
            files: FilePolicy::Sandbox(dir.to_path_buf()),
            ..ServicesConfig::default()
        },
        ..ServerConfig::default()
    };
    let plugin = HostPlugin::new(HostConfig {
        devices: 1,
        lanes,
        ports: 16,
    });
    let runtime = PluginRuntime::new(plugin, config).map_err(|e| e.to_string())?;
    let server = runtime.server();
    let out = CountingSink::default();
    server
        .context()
        .services()
        .set_stdout(Box::new(out.clone()));
    server
        .context()
        .services()
        .set_stdin(Box::new(std::io::empty()));
    server.register_packet(CUSTOM, move |_, p| p.set_word(0, custom(p.word(0))));
    let soak = Arc::new(Soak {
        counters: counters.clone(),
        dir: dir.to_path_buf(),
        custom,
        tag: name,
    });
    let image = HostImage::new(name)
        .generation(generation)
        .kernel("mix", move |warp| soak.mix(warp))
        .kernel("exit", |warp| warp.exit(3))
        .into_bytes();
    let image = runtime.load_image(0, &image).map_err(|e| e.to_string())?;
    // Two blocks of one and a half warps: full and partial masks.
    let grid = Grid::linear(2, lanes + lanes / 2);
    Ok(Runtime {
        runtime,
        image,
        out,
        grid,
        name,
    })
}

/// Runs the soak for `seconds` and returns its report.
pub fn run(seconds: u64) -> Result<Report, String> {
    let dir = std::env::temp_dir().join(format!("rpc-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let counters = Arc::new(Counters::default());
    let runtimes = vec![
        runtime(
            "soak-L32",
            32,
            Generation::V2,
            |x| x * 3 + 1,
            &counters,
            &dir,
        )?,
        runtime(
            "soak-L64",
            64,
            Generation::V1,
            |x| x ^ 0x5A5A,
            &counters,
            &dir,
        )?,
    ];
    let deadline = Instant::now() + Duration::from_secs(seconds);
    // Each runtime launches rounds on its own host thread, so the two servers run at once.
    let mut runtimes = std::thread::scope(|s| {
        let handles: Vec<_> = runtimes
            .into_iter()
            .map(|rt| {
                let counters = &counters;
                s.spawn(move || {
                    let mut round = 0u64;
                    while Instant::now() < deadline {
                        round += 1;
                        let args = (round * 0x1234_5677 + 1).to_le_bytes();
                        let launched = rt.runtime.launch(rt.image, "mix", &args, rt.grid);
                        let synced = launched.and_then(|()| rt.runtime.synchronize(0));
                        if let Err(error) = synced.and_then(|exit| match exit {
                            None => Ok(()),
                            Some(exit) => {
                                Err(PluginError::KernelExited(format!("{exit:?}")).into())
                            }
                        }) {
                            add(&counters.errors_unexpected, 1);
                            eprintln!("soak: {}: round {round}: {error}", rt.name);
                        }
                        if round % 8 == 0 {
                            // A kernel that calls exit(3): the launch reports it.
                            let synced = rt
                                .runtime
                                .launch(rt.image, "exit", &[], Grid::linear(1, 1))
                                .and_then(|()| rt.runtime.synchronize(0));
                            match synced {
                                Ok(Some(KernelExit::Exit(3))) => {
                                    counters.bad(true);
                                }
                                other => {
                                    add(&counters.requests, 1);
                                    add(&counters.errors_unexpected, 1);
                                    eprintln!("soak: {}: exit kernel: {other:?}", rt.name);
                                }
                            }
                        }
                    }
                    rt
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a soak thread panicked"))
            .collect::<Vec<_>>()
    });
    let mut report = Report::default();
    let mut unexpected = 0;
    let mut leaked = 0;
    let mut printed_seen = 0;
    let (mut refused, mut unknown) = (0, 0);
    for rt in &mut runtimes {
        let stats = rt.runtime.server().stats();
        unexpected += stats.panics + stats.errors + stats.bad_headers + stats.abandoned;
        refused += stats.refused;
        unknown += stats.unknown;
        rt.runtime.deinit().map_err(|e| e.to_string())?;
        let server = rt.runtime.server();
        let services = server.context().services();
        leaked += services.open_files() as u64
            + services.live_allocations().len() as u64
            + server.stats().live_workers;
        printed_seen += rt.out.0.load(Ordering::Relaxed);
        eprintln!("soak: {}: {stats}", rt.name);
    }
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    // Refusals and unknown opcodes beyond the deliberate ones are unexpected (and vice versa).
    unexpected += refused.abs_diff(get(&counters.refused_sent));
    unexpected += unknown.abs_diff(get(&counters.unknown_sent));
    report.requests = get(&counters.requests);
    report.answered = get(&counters.answered);
    let printed = get(&counters.printed);
    report.lost = report.requests - report.answered + printed.abs_diff(printed_seen);
    report.errors_expected = get(&counters.errors_expected);
    report.errors_unexpected = get(&counters.errors_unexpected) + unexpected;
    report.leaked = leaked;
    drop(runtimes);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(report)
}
