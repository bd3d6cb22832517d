//! `cuda-gpu-check`: the end-to-end check of the CUDA plugin on a real NVIDIA GPU.
//!
//! ```text
//! cuda-gpu-check PTX [--quick] [--iterations-1warp N] [--iterations-many N] [--timeout-s S]
//! ```
//! PTX is `tools/gpu-check/rpc_client.cu` compiled by nvcc (or clang) to PTX, or by nvcc to a
//! cubin (the driver loads either; the kit's run.sh tries the cubin first): a CUDA client of
//! the protocol and its test kernels. The check initialises [`CudaPlugin`] through
//! [`PluginRuntime`] (EXIT recorded, not ending the process; the device's stdout captured and
//! echoed), loads the PTX (which must carry `__llvm_rpc_client`, so a mailbox is attached),
//! launches each kernel over several blocks of several warps, every warp on its own port, and
//! checks each thread's verdict and the exact lines printed; then it measures TEST_INCREMENT round
//! trips per second with one warp and with many. One `PASS name: ...` or `FAIL name: ...` line
//! per check, then `roundtrips_per_s_1warp=.. roundtrips_per_s_many=.. warps_many=..` and
//! `gpu-check: N passed, M failed`. Exit code 0 only if every check passed; 1 otherwise; 69
//! when there is no driver or device (the reason is printed, e.g.
//! `cuda: 0 devices (libcuda.so.1 not found)`); 2 for bad arguments. A kernel that does not
//! finish within the timeout (default 60 s; a protocol deadlock) fails the check and aborts the
//! process (SIGABRT, status 134 in a shell).
//!
//! Build it where Rust is (`cargo xtask gpu-check`), run it where the GPU is.

use std::io::Write;
use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plugin_cuda::{CudaDevice, CudaPlugin};
use rpc_core::plugin::{Device, Grid};
use rpc_core::protocol::Generation;
use rpc_core::KernelExit;
use rpc_core::{Error, ExitPolicy, PluginError, ServerConfig, ServicesConfig};
use rpc_core::{ImageId, PluginRuntime};

/// The warp width of every NVIDIA GPU.
const WARP: u32 = 32;
/// Bytes of each direction of TEST_STREAM's scratch per thread (the kernel needs >= 4096).
const STREAM_SCRATCH: u64 = 4096;
/// The strings of `rpc_printf_stdout`, by lane % 4 (lane 31 passes a null pointer).
const PRINTF_WORDS: [&str; 4] = [
    "alpha",
    "beta gamma",
    "a string longer than one packet: 0123456789abcdefghijklmnopqrstuvwxyz0123456789",
    "",
];

struct Options {
    ptx: String,
    iterations_1warp: u64,
    iterations_many: u64,
    timeout: Duration,
}

/// The most round trips a measurement may be asked for.
const MAX_ITERATIONS: u64 = 100_000_000;
/// The longest a kernel may be given, in seconds (a day).
const MAX_TIMEOUT_S: u64 = 86_400;

/// The command line.
#[derive(clap::Parser)]
#[command(
    name = "cuda-gpu-check",
    about = "The end-to-end check of the CUDA plugin on a real NVIDIA GPU",
    after_help = "Exit status: 0 every check passed, 1 a check failed, 2 bad arguments, 69 no \
                  driver or device; a kernel past --timeout-s aborts the process (134)"
)]
struct Cli {
    /// tools/gpu-check/rpc_client.cu compiled to PTX (nvcc or clang) or a cubin (nvcc)
    #[arg(value_name = "PTX")]
    ptx: String,
    /// Fewer round trips: 2000 with one warp, 20 per warp with many
    #[arg(long)]
    quick: bool,
    /// Round trips measured with one warp [default: 20000, 2000 with --quick]
    #[arg(long, value_name = "N", value_parser = iterations, allow_negative_numbers = true)]
    iterations_1warp: Option<u64>,
    /// Round trips per warp measured with many warps [default: 200, 20 with --quick]
    #[arg(long, value_name = "N", value_parser = iterations, allow_negative_numbers = true)]
    iterations_many: Option<u64>,
    /// Seconds a kernel may run before the check fails and the process aborts
    #[arg(long, value_name = "S", default_value = "60", value_parser = timeout_s,
          allow_negative_numbers = true)]
    timeout_s: u64,
}

/// A number of round trips: 1 to [`MAX_ITERATIONS`].
fn iterations(text: &str) -> Result<u64, String> {
    text.parse()
        .ok()
        .filter(|n| (1..=MAX_ITERATIONS).contains(n))
        .ok_or_else(|| format!("wants a whole number from 1 to {MAX_ITERATIONS}"))
}

/// Seconds: 1 to [`MAX_TIMEOUT_S`].
fn timeout_s(text: &str) -> Result<u64, String> {
    text.parse()
        .ok()
        .filter(|n| (1..=MAX_TIMEOUT_S).contains(n))
        .ok_or_else(|| format!("wants whole seconds from 1 to {MAX_TIMEOUT_S}"))
}

/// Parses the command line; `--help` (exit 0) or a usage error (exit 2, the message and the
/// usage) ends the process.
fn parse_args() -> Options {
    use clap::{CommandFactory, Parser};
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(help) if !help.use_stderr() => help.exit(),
        Err(error) => {
            let text = error.render().to_string();
            eprint!("{text}");
            if !text.contains("Usage:") {
                eprintln!("\n{}", Cli::command().render_usage());
            }
            std::process::exit(2)
        }
    };
    let (one_warp, many) = if cli.quick {
        (2_000, 20)
    } else {
        (20_000, 200)
    };
    Options {
        ptx: cli.ptx,
        iterations_1warp: cli.iterations_1warp.unwrap_or(one_warp),
        iterations_many: cli.iterations_many.unwrap_or(many),
        timeout: Duration::from_secs(cli.timeout_s),
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let options = parse_args();
    match run(&options) {
        Ok(Some(true)) => ExitCode::SUCCESS,
        Ok(Some(false)) => ExitCode::FAILURE,
        Ok(None) => ExitCode::from(NO_DEVICE),
        Err(error) => {
            println!("gpu-check: FAIL: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The device's stdout: kept for the checks and echoed as it comes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        let mut out = std::io::stdout().lock();
        out.write_all(bytes)?;
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}

impl Captured {
    /// What was printed since the last call.
    fn take(&self) -> String {
        let bytes = std::mem::take(&mut *self.0.lock().unwrap());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Device memory from the plugin's allocator (a raw block: `cuMemAlloc` aligns it to at least
/// 256 bytes), zeroed; freed on drop.
struct DeviceBuffer<'a> {
    device: &'a CudaDevice,
    addr: u64,
    len: usize,
}

impl<'a> DeviceBuffer<'a> {
    fn zeroed(device: &'a CudaDevice, len: usize) -> Result<Self, String> {
        let addr = device
            .allocator()
            .allocate(len as u64)
            .map_err(|e| format!("allocating {len} device bytes: {e}"))?;
        let buffer = DeviceBuffer { device, addr, len };
        device
            .copy_to_device(addr, &vec![0u8; len])
            .map_err(|e| format!("zeroing device memory: {e}"))?;
        Ok(buffer)
    }

    fn read(&self) -> Result<Vec<u8>, String> {
        let mut bytes = vec![0u8; self.len];
        self.device
            .copy_from_device(self.addr, &mut bytes)
            .map_err(|e| format!("reading device memory: {e}"))?;
        Ok(bytes)
    }

    /// The block as words of `N` bytes, each made by `word` (`u32::from_le_bytes`).
    fn read_words<const N: usize, T>(&self, word: fn([u8; N]) -> T) -> Result<Vec<T>, String> {
        Ok(self
            .read()?
            .chunks_exact(N)
            .map(|c| word(c.try_into().unwrap()))
            .collect())
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: `addr` is the block `allocate(len)` returned in `zeroed`, freed only here.
        let freed = unsafe {
            self.device
                .allocator()
                .deallocate(self.addr, self.len as u64)
        };
        if let Err(error) = freed {
            eprintln!("cuda-gpu-check: freeing device memory: {error}");
        }
    }
}

/// A kernel's parameter block: every parameter is a pointer or a 64-bit integer.
fn pack(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

struct Check<'a> {
    runtime: &'a PluginRuntime<CudaPlugin>,
    image: ImageId,
    out: Captured,
    timeout: Duration,
}

impl Check<'_> {
    fn device(&self) -> &CudaDevice {
        &self.runtime.devices()[0]
    }

    /// Launches `kernel` and waits for it (and for the server to finish its requests); a kernel
    /// that ended the program with EXIT or ABORT is an error here.
    fn run(&self, kernel: &str, args: &[u64], grid: Grid) -> Result<Duration, Error> {
        match self.run_to_end(kernel, args, grid)? {
            (None, elapsed) => Ok(elapsed),
            (Some(exit), _) => Err(PluginError::KernelExited(format!("{exit:?}")).into()),
        }
    }

    /// Launches `kernel` and waits for it; how it ended itself, if it did. A kernel still
    /// running after the timeout ends the process.
    fn run_to_end(
        &self,
        kernel: &str,
        args: &[u64],
        grid: Grid,
    ) -> Result<(Option<KernelExit>, Duration), Error> {
        let (done, watch) = mpsc::channel::<()>();
        let timeout = self.timeout;
        let name = kernel.to_owned();
        let watchdog = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = watch.recv_timeout(timeout) {
                println!(
                    "FAIL {name}: still running after {} s (a protocol deadlock?)",
                    timeout.as_secs()
                );
                println!("gpu-check: FAIL (aborting: the kernel cannot be stopped otherwise)");
                // Not `exit`: its handlers could wait on the driver, which waits on the kernel.
                std::process::abort();
            }
        });
        let start = Instant::now();
        let result = self
            .runtime
            .launch(self.image, kernel, &pack(args), grid)
            .and_then(|()| self.runtime.synchronize(0));
        let elapsed = start.elapsed();
        let _ = done.send(());
        let _ = watchdog.join();
        result.map(|exit| (exit, elapsed))
    }

    fn threads(grid: Grid) -> usize {
        (grid.total_blocks() * grid.threads_per_block()) as usize
    }

    /// TEST_INCREMENT: every thread's verdict.
    fn increment(&self, grid: Grid, iterations: u64, skip_odd: bool) -> Result<String, String> {
        let threads = Self::threads(grid);
        let result = DeviceBuffer::zeroed(self.device(), threads * 4)?;
        self.run(
            "rpc_test_increment",
            &[result.addr, iterations, u64::from(skip_odd)],
            grid,
        )
        .map_err(|e| e.to_string())?;
        verdicts(&result.read_words(u32::from_le_bytes)?)?;
        Ok(format!(
            "{threads} threads x {iterations} round trips{}",
            if skip_odd { ", odd lanes absent" } else { "" }
        ))
    }

    fn stream(&self, grid: Grid) -> Result<String, String> {
        let threads = Self::threads(grid);
        let result = DeviceBuffer::zeroed(self.device(), threads * 4)?;
        let scratch = DeviceBuffer::zeroed(self.device(), threads * 2 * STREAM_SCRATCH as usize)?;
        self.run(
            "rpc_test_stream",
            &[result.addr, scratch.addr, STREAM_SCRATCH],
            grid,
        )
        .map_err(|e| e.to_string())?;
        verdicts(&result.read_words(u32::from_le_bytes)?)?;
        Ok(format!(
            "{threads} threads x 15 streams of 0..3937 bytes echoed"
        ))
    }

    fn write_stdout(&self, grid: Grid) -> Result<String, String> {
        let threads = Self::threads(grid);
        let result = DeviceBuffer::zeroed(self.device(), threads * 4)?;
        self.out.take();
        self.run("rpc_write_stdout", &[result.addr], grid)
            .map_err(|e| e.to_string())?;
        let printed = self.out.take();
        verdicts(&result.read_words(u32::from_le_bytes)?)?;
        let expected = each_thread(grid, |block, warp, lane| {
            format!("hello from block {block} warp {warp} lane {lane}\n")
        });
        same_lines(&printed, &expected)?;
        Ok(format!("{threads} lines, each exact"))
    }

    fn printf(&self, grid: Grid) -> Result<String, String> {
        let threads = Self::threads(grid);
        let result = DeviceBuffer::zeroed(self.device(), threads * 4)?;
        let written = DeviceBuffer::zeroed(self.device(), threads * 8)?;
        self.out.take();
        self.run("rpc_printf_stdout", &[result.addr, written.addr], grid)
            .map_err(|e| e.to_string())?;
        let printed = self.out.take();
        verdicts(&result.read_words(u32::from_le_bytes)?)?;
        let expected = each_thread(grid, |block, warp, lane| {
            let word = if lane == 31 {
                "(null)"
            } else {
                PRINTF_WORDS[lane as usize % 4]
            };
            let value = f64::from(lane) * 1.25 + f64::from(block);
            format!("block {block} warp {warp} lane {lane}: {word} {value:5.2}\n")
        });
        let written = written.read_words(u64::from_le_bytes)?;
        for (thread, (line, &count)) in expected.iter().zip(&written).enumerate() {
            if count != line.len() as u64 {
                return Err(format!(
                    "thread {thread}: printf returned {count}, expected {} for {line:?}",
                    line.len()
                ));
            }
        }
        same_lines(&printed, &expected)?;
        Ok(format!(
            "{threads} lines with %d %s %5.2f, (null) and strings over one packet"
        ))
    }

    fn exit(&self) -> Result<String, String> {
        let grid = Grid::linear(1, WARP);
        let result = DeviceBuffer::zeroed(self.device(), WARP as usize * 4)?;
        match self.run_to_end("rpc_exit", &[result.addr, 7], grid) {
            Ok((Some(KernelExit::Exit(7)), _)) => {}
            Err(error) => return Err(format!("synchronize said {error}, expected exit(7)")),
            Ok((other, _)) => return Err(format!("synchronize reported {other:?}, not exit(7)")),
        }
        verdicts(&result.read_words(u32::from_le_bytes)?)?;
        // Recorded once: the next synchronize is clean.
        self.runtime.synchronize(0).map_err(|e| e.to_string())?;
        Ok("recorded as exit(7), the kernel returned".into())
    }

    /// Round trips per second of TEST_INCREMENT over `grid`, each warp looping `iterations`.
    fn rate(&self, grid: Grid, iterations: u64) -> Result<f64, String> {
        let threads = Self::threads(grid);
        let result = DeviceBuffer::zeroed(self.device(), threads * 4)?;
        let elapsed = self
            .run("rpc_test_increment", &[result.addr, iterations, 0], grid)
            .map_err(|e| e.to_string())?;
        verdicts(&result.read_words(u32::from_le_bytes)?)?;
        let warps = grid.total_blocks() * grid.threads_per_block().div_ceil(u64::from(WARP));
        Ok((warps * iterations) as f64 / elapsed.as_secs_f64())
    }
}

/// `make(block, warp, lane)` for every thread of a one-dimensional grid, in thread order.
fn each_thread(grid: Grid, make: impl Fn(u32, u32, u32) -> String) -> Vec<String> {
    let mut all = Vec::new();
    for block in 0..grid.blocks[0] {
        for thread in 0..grid.threads[0] {
            all.push(make(block, thread / WARP, thread % WARP));
        }
    }
    all
}

/// Every thread's verdict is 1; otherwise the failures, a few of them shown.
fn verdicts(codes: &[u32]) -> Result<(), String> {
    let failed: Vec<String> = codes
        .iter()
        .enumerate()
        .filter(|(_, &code)| code != 1)
        .map(|(thread, &code)| {
            if code == 0 {
                format!("thread {thread}: no verdict")
            } else {
                format!("thread {thread}: code {code:#x}")
            }
        })
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    let shown: Vec<&str> = failed.iter().take(8).map(String::as_str).collect();
    Err(format!(
        "{} of {} threads failed ({})",
        failed.len(),
        codes.len(),
        shown.join("; ")
    ))
}

/// The printed text is exactly the expected lines, in any order (warps run concurrently; each
/// lane's line must arrive whole).
fn same_lines(printed: &str, expected: &[String]) -> Result<(), String> {
    let mut got: Vec<&str> = printed.split_inclusive('\n').collect();
    let mut want: Vec<&str> = expected.iter().map(String::as_str).collect();
    got.sort_unstable();
    want.sort_unstable();
    if got == want {
        return Ok(());
    }
    let missing = want.iter().find(|line| !got.contains(line));
    let extra = got.iter().find(|line| !want.contains(line));
    Err(format!(
        "printed {} lines, expected {}; first missing {missing:?}, first unexpected {extra:?}",
        got.len(),
        want.len()
    ))
}

/// The exit status when there is no driver or no device (`sysexits.h` `EX_UNAVAILABLE`, as
/// `rpc-run`'s): the kit's run.sh reports the check as skipped.
const NO_DEVICE: u8 = 69;

/// Runs every check: whether all passed, `None` with no device to run on.
fn run(options: &Options) -> Result<Option<bool>, String> {
    let config = ServerConfig {
        services: ServicesConfig {
            exit: ExitPolicy::Record,
            ..ServicesConfig::default()
        },
        ..ServerConfig::default()
    };
    let runtime = PluginRuntime::new(CudaPlugin::new(), config).map_err(|e| e.to_string())?;
    println!("{}", rpc_core::plugin::describe(runtime.plugin()));
    if runtime.devices().is_empty() {
        println!("gpu-check: SKIP: no CUDA device to check");
        return Ok(None);
    }
    let out = Captured::default();
    runtime
        .server()
        .context()
        .services()
        .set_stdout(Box::new(out.clone()));

    let ptx = std::fs::read(&options.ptx).map_err(|e| format!("reading {}: {e}", options.ptx))?;
    let image = runtime
        .load_image(0, &ptx)
        .map_err(|e| format!("loading {}: {e}", options.ptx))?;
    let device = &runtime.devices()[0];
    let ports = Generation::V1.ports_for(device.parallelism());
    if runtime.mailbox(image).is_none() {
        return Err(format!(
            "{} has no __llvm_rpc_client: no mailbox attached",
            options.ptx
        ));
    }
    println!(
        "PASS load: {} loaded, __llvm_rpc_client found (v1, 552 bytes), mailbox of {ports} ports x {WARP} lanes attached",
        options.ptx
    );
    let check = Check {
        runtime: &runtime,
        image,
        out,
        timeout: options.timeout,
    };

    let (mut passed, mut failed) = (1u32, 0u32);
    let mut report = |name: &str, outcome: Result<String, String>| match outcome {
        Ok(detail) => {
            passed += 1;
            println!("PASS {name}: {detail}");
        }
        Err(why) => {
            failed += 1;
            println!("FAIL {name}: {why}");
        }
    };
    // Several blocks of several warps; 100 threads per block leaves a partial last warp.
    report("increment", check.increment(Grid::linear(4, 128), 8, false));
    report(
        "increment-partial-warps",
        check.increment(Grid::linear(3, 100), 4, false),
    );
    report(
        "increment-odd-lanes-absent",
        check.increment(Grid::linear(2, 64), 4, true),
    );
    report("stream", check.stream(Grid::linear(4, 64)));
    report("write-to-stdout", check.write_stdout(Grid::linear(3, 96)));
    report("printf", check.printf(Grid::linear(2, 128)));
    report("exit", check.exit());

    let sms = device.multiprocessors().max(1);
    let many = Grid::linear(sms, 256);
    let many_warps = many.total_blocks() * 8;
    let one = Grid::linear(1, WARP);
    // Warm-up (first launch costs), not measured.
    let _ = check.rate(one, 100);
    let rates = check
        .rate(one, options.iterations_1warp)
        .and_then(|one| Ok((one, check.rate(many, options.iterations_many)?)));
    match rates {
        Ok((one, many)) => {
            report(
                "throughput",
                Ok(format!(
                    "1 warp x {} and {many_warps} warps x {} TEST_INCREMENT round trips",
                    options.iterations_1warp, options.iterations_many
                )),
            );
            println!(
                "roundtrips_per_s_1warp={one:.0} roundtrips_per_s_many={many:.0} warps_many={many_warps}"
            );
        }
        Err(why) => report("throughput", Err(why)),
    }
    let stats = runtime.server().stats();
    println!(
        "server: served {} requests, {} errors, {} refused, {} unknown, {} bad headers",
        stats.total_served(),
        stats.errors,
        stats.refused,
        stats.unknown,
        stats.bad_headers
    );
    if stats.errors + stats.unknown + stats.bad_headers + stats.panics > 0 {
        failed += 1;
        println!("FAIL server: handler errors, unknown opcodes or bad headers (see the log)");
    } else {
        passed += 1;
        println!("PASS server: no handler error, unknown opcode or bad header");
    }
    println!("gpu-check: {passed} passed, {failed} failed");
    Ok(Some(failed == 0))
}
