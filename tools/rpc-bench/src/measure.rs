//! The measurements: each returns one repetition's figure, speaking the real protocol.

use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use plugin_host::kernel::{encode_printf, printf, Arg, PrintfCall, Target};
use rpc_core::protocol::{Client, Layout, LockTable};
use rpc_core::Opcode;

use crate::target::{schedstat, Mapping, Server, Setup};
use crate::{pin_server, spin_then_yield, SpinThenYield, STREAM_BYTES};

/// One TEST_INCREMENT exchange on port `index` with the lanes of `mask`; checks the answer.
pub fn increment(client: &Client<'_>, index: u32, mask: u64, x: u64) -> Result<(), String> {
    let mut attempt = 0;
    let mut port = loop {
        // None: the server has not closed the port's last exchange yet.
        match client
            .try_open_at(index, Opcode::TEST_INCREMENT, mask)
            .map_err(|e| e.to_string())?
        {
            Some(port) => break port,
            None => spin_then_yield(attempt),
        }
        attempt += 1;
    };
    let mut ok = true;
    port.send_and_recv(
        |lane, p| p.set_word(0, x + u64::from(lane)),
        |lane, p| ok &= p.word(0) == x + u64::from(lane) + 1,
    )
    .map_err(|e| e.to_string())?;
    if ok {
        Ok(())
    } else {
        Err(format!("TEST_INCREMENT on port {index}: wrong answer"))
    }
}

/// The exchange of a pipelined row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pipelined {
    /// TEST_INCREMENT: one packet each way.
    Increment,
    /// A printf of one lane: four hand-overs (format, sizes, arguments, result).
    Printf,
    /// TEST_STREAM of [`PIPELINED_STREAM_BYTES`]: four packets sent, four echoed.
    Stream,
}

/// The bytes of a pipelined stream: the first packet's 56, then three of 64.
pub const PIPELINED_STREAM_BYTES: usize = 56 + 3 * 64;

impl Pipelined {
    pub const ALL: [Pipelined; 3] = [Pipelined::Increment, Pipelined::Printf, Pipelined::Stream];

    pub fn name(self) -> &'static str {
        match self {
            Pipelined::Increment => "increment",
            Pipelined::Printf => "printf",
            Pipelined::Stream => "stream",
        }
    }

    fn opcode(self) -> Opcode {
        match self {
            Pipelined::Increment => Opcode::TEST_INCREMENT,
            Pipelined::Printf => Opcode::PRINTF_TO_STDOUT,
            Pipelined::Stream => Opcode::TEST_STREAM,
        }
    }

    /// The client's operations per exchange.
    fn steps(self) -> u8 {
        match self {
            Pipelined::Increment => 2,
            Pipelined::Printf => 4,
            Pipelined::Stream => 8,
        }
    }

    /// Whether the client's next packet comes D after operation `step` (counted from 0): the
    /// packet that answers a reply. A printf's or an increment's operations alternate send and
    /// recv, so that is after each recv; every operation of a stream hands a packet over (a
    /// send, or a recv's acknowledgement of the packet before), so after each.
    fn delay_after(self, step: u8) -> bool {
        match self {
            Pipelined::Increment | Pipelined::Printf => step % 2 == 1,
            Pipelined::Stream => true,
        }
    }
}

/// One client thread drives `ports` exchanges of `kind` at once, each on its own port, sending
/// each next packet `delay` after the reply it answers; returns exchanges per second. The
/// client's wait is `Resumable`, so an operation whose buffer is not back yet returns
/// `WouldBlock` and is retried on the next round over the ports (every operation is one packet
/// and starts with its wait: nothing is sent twice).
pub fn pipelined(
    setup: &Setup,
    ports: u32,
    kind: Pipelined,
    delay: Duration,
    window: Duration,
) -> Result<f64, String> {
    let _serving = setup.serving();
    let client = Client::new(setup.view(), setup.locks())
        .map_err(|e| e.to_string())?
        .with_wait(&rpc_core::protocol::Resumable);
    let format: &[u8] = b"%d %d %d\n\0";
    let args = [7u8; 12];
    let stream: Vec<u8> = (0..PIPELINED_STREAM_BYTES).map(|i| i as u8).collect();
    // The bytes of stream packet `n` after the first (1..=3), 64 each.
    let stream_packet = |n: u8| &stream[56 + 64 * (usize::from(n) - 1)..][..64];
    // Whether a port operation went through: Ok(false) if it must wait (`WouldBlock`).
    let done = |result: rpc_core::Result<(), rpc_core::ProtocolError>| match result {
        Ok(()) => Ok(true),
        Err(rpc_core::ProtocolError::WouldBlock { .. }) => Ok(false),
        Err(e) => Err(e.to_string()),
    };
    // A recv whose packet must start with `want` (else the error `wrong`, on port `k`).
    let recv_expecting =
        |port: &mut rpc_core::protocol::ClientPort<'_>, k: u32, want: u64, wrong: &str| {
            let mut word = want;
            let received = done(port.recv(|_, p| word = p.word(0)))?;
            if word != want {
                return Err(format!("port {k}: {wrong}"));
            }
            Ok(received)
        };
    // Step `step` (after the open) of the exchange on `port` `k`: Ok(false) if it must wait.
    let run = |port: &mut rpc_core::protocol::ClientPort<'_>, k: u32, step: u8| match (kind, step) {
        (Pipelined::Increment, 0) => done(port.send(|_, p| p.set_word(0, u64::from(k)))),
        (Pipelined::Increment, _) => {
            recv_expecting(port, k, u64::from(k) + 1, "TEST_INCREMENT: wrong answer")
        }
        (Pipelined::Printf, 0) => done(port.send_n(&[format])),
        (Pipelined::Printf, 2) => done(port.send_n(&[&args])),
        (Pipelined::Printf, _) => done(port.recv(|_, _| {})),
        (Pipelined::Stream, 0) => done(port.send(|_, p| {
            p.set_word(0, PIPELINED_STREAM_BYTES as u64);
            p.write_bytes(8, &stream[..56]);
        })),
        (Pipelined::Stream, 1..=3) => done(port.send(|_, p| p.write_bytes(0, stream_packet(step)))),
        (Pipelined::Stream, 4) => recv_expecting(
            port,
            k,
            PIPELINED_STREAM_BYTES as u64,
            "TEST_STREAM: wrong length echoed",
        ),
        (Pipelined::Stream, n) => {
            let first = stream_packet(n - 4)[..8].try_into().expect("8 bytes");
            recv_expecting(
                port,
                k,
                u64::from_le_bytes(first),
                "TEST_STREAM: wrong bytes echoed",
            )
        }
    };
    // Per port: the open exchange and its next step, and when that step may be sent.
    let mut open: Vec<Option<(rpc_core::protocol::ClientPort<'_>, u8)>> =
        (0..ports).map(|_| None).collect();
    let mut ready = vec![Instant::now(); ports as usize];
    let start = Instant::now();
    let mut done = 0u64;
    // One clock read a round over the ports, and one more per step only where a delay
    // follows: at M=1 the clock reads were most of the client's loop, each one adding to how
    // late it noticed a reply.
    loop {
        let now = Instant::now();
        if now - start >= window {
            break;
        }
        for k in 0..ports as usize {
            if now < ready[k] {
                continue;
            }
            if open[k].is_none() {
                open[k] = client
                    .try_open_at(k as u32, kind.opcode(), 1)
                    .map_err(|e| e.to_string())?
                    .map(|port| (port, 0));
            }
            let Some((port, step)) = &mut open[k] else {
                continue;
            };
            if !run(port, k as u32, *step)? {
                continue;
            }
            if !delay.is_zero() && kind.delay_after(*step) {
                ready[k] = Instant::now() + delay;
            }
            *step += 1;
            if *step == kind.steps() {
                open[k] = None;
                done += 1;
            }
        }
    }
    // Let the exchanges still open finish, so the server is idle for the next row.
    let deadline = Instant::now() + Duration::from_secs(5);
    while open.iter().any(Option::is_some) {
        for (k, slot) in open.iter_mut().enumerate() {
            let Some((port, step)) = slot else { continue };
            if run(port, k as u32, *step)? {
                *step += 1;
                if *step == kind.steps() {
                    *slot = None;
                }
            }
        }
        if Instant::now() > deadline {
            return Err("pipelined: exchanges did not finish".into());
        }
    }
    Ok(done as f64 / start.elapsed().as_secs_f64())
}

/// Runs `op` in batches for a warm-up and then `window`; returns ns per op.
pub fn time_per_op(
    window: Duration,
    mut op: impl FnMut(u64) -> Result<(), String>,
) -> Result<f64, String> {
    const BATCH: u64 = 32;
    let mut x = 0;
    let warm_up = Instant::now();
    while warm_up.elapsed() < window / 4 {
        for _ in 0..BATCH {
            op(x)?;
            x += 1;
        }
    }
    let start = Instant::now();
    let mut ops = 0;
    loop {
        for _ in 0..BATCH {
            op(x)?;
            x += 1;
        }
        ops += BATCH;
        let elapsed = start.elapsed();
        if elapsed >= window {
            return Ok(elapsed.as_nanos() as f64 / ops as f64);
        }
    }
}

/// A `u32` alone on its cache line (128 bytes: also clear of the adjacent-line prefetcher).
#[repr(align(128))]
struct Line(AtomicU32);

/// One repetition of the ping-pong reference: ns per round trip.
pub fn pingpong(window: Duration) -> Result<f64, String> {
    const STOP: u32 = u32::MAX;
    let flags = Arc::new((Line(AtomicU32::new(0)), Line(AtomicU32::new(0))));
    let partner = {
        let flags = flags.clone();
        thread::spawn(move || {
            pin_server(0);
            let (ping, pong) = (&flags.0 .0, &flags.1 .0);
            let mut seen = 0;
            loop {
                let mut attempt = 0;
                let value = loop {
                    let value = ping.load(Ordering::Acquire);
                    if value != seen {
                        break value;
                    }
                    spin_then_yield(attempt);
                    attempt += 1;
                };
                if value == STOP {
                    return;
                }
                seen = value;
                pong.store(value, Ordering::Release);
            }
        })
    };
    let (ping, pong) = (&flags.0 .0, &flags.1 .0);
    let result = time_per_op(window, |x| {
        let value = (x % (STOP as u64 - 1)) as u32 + 1;
        // Never the same value twice in a row, so the partner sees every change.
        let value = if value == ping.load(Ordering::Relaxed) {
            value % (STOP - 1) + 1
        } else {
            value
        };
        ping.store(value, Ordering::Release);
        let mut attempt = 0;
        while pong.load(Ordering::Acquire) != value {
            spin_then_yield(attempt);
            attempt += 1;
        }
        Ok(())
    });
    ping.store(STOP, Ordering::Release);
    partner
        .join()
        .map_err(|_| "pingpong partner panicked".to_string())?;
    result
}

/// A typed call of the bench (PROTOCOL section 12, `--dispatch-tests`' functions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Typed {
    /// `uint64_t add(uint64_t a, uint32_t b)`: one packet each way.
    Add,
    /// `uint64_t sum(const uint32_t *xs, uint64_t n)` of a 4 KiB span: the span's 65 packets
    /// in, its 65 back (LLVM copies every pointer back), three more.
    Sum,
}

/// The elements of the `sum` row's span: 4 KiB.
pub const SUM_ELEMENTS: usize = 1024;

/// One repetition of typed round trips (one lane, port 0), as LLVM's `rpc::dispatch` makes
/// them: ns per call. Each answer is checked.
pub fn typed(setup: &Setup, call: Typed, window: Duration) -> Result<f64, String> {
    use rpc_core::protocol::{dispatch, CallArg};
    use rpc_core::services::dispatch_tests::opcode;
    let _serving = setup.serving();
    let client = setup.client();
    let mut span: Vec<u8> = (0..SUM_ELEMENTS as u32)
        .flat_map(|i| i.to_le_bytes())
        .collect();
    let span_sum: u64 = (0..SUM_ELEMENTS as u64).sum();
    time_per_op(window, |x| {
        let mut attempt = 0;
        let (op, mut args, want) = match call {
            Typed::Add => (
                opcode(0),
                vec![CallArg::value(x), CallArg::value(7u32)],
                x.wrapping_add(7),
            ),
            Typed::Sum => (
                opcode(4),
                vec![
                    CallArg::Pointer(Some(&mut span[..])),
                    CallArg::value(SUM_ELEMENTS as u64),
                ],
                span_sum,
            ),
        };
        let mut port = loop {
            // None: the server has not closed the port's last exchange yet.
            match client.try_open_at(0, op, 1).map_err(|e| e.to_string())? {
                Some(port) => break port,
                None => spin_then_yield(attempt),
            }
            attempt += 1;
        };
        let got =
            dispatch(&mut port, std::slice::from_mut(&mut args), 8).map_err(|e| e.to_string())?;
        let got = u64::from_le_bytes(got[0][..].try_into().map_err(|_| "a short result")?);
        if got == want {
            Ok(())
        } else {
            Err(format!("typed {call:?}: {got}, expected {want}"))
        }
    })
}

/// One repetition of TEST_INCREMENT round trips on port `index`: ns per round trip.
pub fn roundtrip(setup: &Setup, index: u32, mask: u64, window: Duration) -> Result<f64, String> {
    let _serving = setup.serving();
    let client = setup.client();
    time_per_op(window, |x| increment(&client, index, mask, x))
}

/// One repetition of TEST_INCREMENT round trips on port 0 against a bare `rpc_core::Server`
/// loop (a thread that only opens pending ports and answers them: no `RpcServer`, registry,
/// statistics or back-off): ns per round trip. The gap to `roundtrip` is the cost of the real
/// server's per-pass and per-request work; the gap to `pingpong` that of the protocol itself.
pub fn bare_roundtrip(setup: &Setup, window: Duration) -> Result<f64, String> {
    let server_locks = LockTable::new(setup.layout().ports());
    against_loop(setup, 0, window, |stop| {
        let server = rpc_core::protocol::ServerEnd::new(setup.view(), server_locks.words())
            .expect("lock table sized for the mailbox");
        let mut idle = 0;
        while !stop.load(Ordering::Relaxed) {
            match server.open_next(0, &SpinThenYield) {
                Some(mut port) => {
                    let _ = port.recv_and_send(|_, p| p.set_word(0, p.word(0) + 1));
                    idle = 0;
                }
                None => {
                    spin_then_yield(idle);
                    idle += 1;
                }
            }
        }
    })
}

/// The least a server can do, the floor of the round-trip rows: waits for port `index`'s
/// flags to differ, reads the header's opcode and the packet, writes the answer and flips its
/// flag, with atomics at the layout's offsets and nothing else (no scan of other ports, lock,
/// registry, statistics or back-off but the bare loop's); until `stop` is set.
///
/// It runs in a process of its own for the cross-process rows ([`Server::Floor`], this
/// binary's `floor-serve`), and on a thread of the bench for the in-process server's
/// ([`thread_floor_roundtrip`]): either way on the very file the server processes serve, so a
/// hand-over crosses the same cache lines between the same two CPUs.
pub fn floor_loop(mailbox: &Mapping, layout: Layout, index: u32, stop: &AtomicBool) {
    let ours = mailbox.u32_at(layout.primary() + 4 * index as usize);
    let theirs = mailbox.u32_at(layout.secondary() + 4 * index as usize);
    let opcode = mailbox.u32_at(layout.header_of(index) + 8);
    let word = mailbox.u64_at(layout.packet_of(index, 0));
    let mut idle = 0;
    // Relaxed: the flag only ends the loop, after the client's last answer came back.
    while !stop.load(Ordering::Relaxed) {
        let flag = ours.load(Ordering::Relaxed);
        if (theirs.load(Ordering::Relaxed) != 0) == (flag != 0) {
            spin_then_yield(idle);
            idle += 1;
            continue;
        }
        idle = 0;
        // Acquire: the client's header and packet, written before its flip.
        fence(Ordering::Acquire);
        if opcode.load(Ordering::Relaxed) == Opcode::TEST_INCREMENT.0 {
            word.store(word.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
        // Release: the answer before the flip that hands it back.
        ours.store(u32::from(flag == 0), Ordering::Release);
    }
}

/// One repetition of TEST_INCREMENT round trips on port `index` against [`floor_loop`] on a
/// thread of the bench ([`Server::ThreadFloor`]), on `setup`'s mailbox file: ns per round
/// trip. (The cross-process floor is a server process: [`roundtrip`] against its setup.)
pub fn thread_floor_roundtrip(setup: &Setup, index: u32, window: Duration) -> Result<f64, String> {
    let mailbox = setup
        .mapping()
        .ok_or("the thread floor runs on a server process's mailbox file")?;
    against_loop(setup, index, window, |stop| {
        floor_loop(mailbox, setup.layout(), index, stop)
    })
}

/// TEST_INCREMENT round trips on port `index` of `setup`'s mailbox against `serve`, a server
/// loop of the bench's own run on the servers' CPU until its flag is set: ns per round trip.
/// `setup` is a server process, which stays stopped meanwhile (rpc-serve's, whose mailbox
/// every server of its shape shares), so the loop crosses the very lines the servers serve.
fn against_loop(
    setup: &Setup,
    index: u32,
    window: Duration,
    serve: impl FnOnce(&AtomicBool) + Send,
) -> Result<f64, String> {
    if setup.server == Server::InProcess {
        return Err("the bench's own loops run on a stopped server process's mailbox".into());
    }
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        scope.spawn(|| {
            pin_server(0);
            serve(&stop);
        });
        let client = setup.client();
        let result = time_per_op(window, |x| increment(&client, index, 1, x));
        // Relaxed: the flag only ends the loop, after the client's last answer came back.
        stop.store(true, Ordering::Relaxed);
        result
    })
}

/// One TEST_STREAM exchange of `STREAM_BYTES` per active lane: MB/s of payload carried (both
/// directions, all lanes).
pub fn stream(setup: &Setup, mask: u64, data: &[Vec<u8>]) -> Result<f64, String> {
    let _serving = setup.serving();
    let client = setup.client();
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let start = Instant::now();
    let mut port = client
        .open(Opcode::TEST_STREAM, mask)
        .map_err(|e| e.to_string())?;
    port.send_n(&slices).map_err(|e| e.to_string())?;
    let back = port
        .recv_n(STREAM_BYTES as u64)
        .map_err(|e| e.to_string())?;
    drop(port);
    let seconds = start.elapsed().as_secs_f64();
    let lanes = mask.count_ones() as usize;
    for lane in 0..lanes {
        if back[lane] != data[lane] {
            return Err(format!("TEST_STREAM: lane {lane} came back different"));
        }
    }
    Ok((2 * lanes * STREAM_BYTES) as f64 / seconds / 1e6)
}

/// One repetition of printf from 32 lanes (`"lane %d of %s: %d\n"`, the `%s` fetched from the
/// client as the protocol does): lines per second.
///
/// The calls are encoded once per repetition, outside the timed requests: a GPU's lanes encode
/// their calls at once, in about the time of one, while this client's one thread would encode
/// 32 in a row (9-12 µs a request here), a cost that no GPU kernel pays and that is the same
/// for every server.
pub fn printf_lines(setup: &Setup, window: Duration, repetition: i64) -> Result<f64, String> {
    let _serving = setup.serving();
    let client = setup.client();
    let lanes = setup.layout().lanes();
    let mask = if lanes == 64 {
        u64::MAX
    } else {
        (1u64 << lanes) - 1
    };
    let calls = printf_calls(lanes, repetition);
    let per_op = time_per_op(window, |_| {
        let results =
            printf(&client, mask, Target::Stdout, false, &calls).map_err(|e| e.to_string())?;
        if results[..lanes as usize].iter().any(|&n| n <= 0) {
            return Err(format!("printf: the server reported {:?}", &results[..4]));
        }
        Ok(())
    })?;
    Ok(f64::from(lanes) * 1e9 / per_op)
}

/// The calls of one request of the printf lines row, lane by lane.
fn printf_calls(lanes: u32, x: i64) -> Vec<PrintfCall> {
    (0..lanes)
        .map(|lane| {
            let args = [
                Arg::Int(i64::from(lane)),
                Arg::Str(Some("rpc-bench")),
                Arg::Int(x),
            ];
            encode_printf("lane %d of %s: %d\n", &args, false)
        })
        .collect()
}

/// The server's CPU share (percent of one core) over `window`, during which it serves (a
/// kernel runs) and nothing is asked.
pub fn cpu_share(setup: &Setup, window: Duration) -> Result<f64, String> {
    let (cpu, wall) = (setup.cpu()?, Instant::now());
    thread::sleep(window);
    let (cpu, wall) = (setup.cpu()? - cpu, wall.elapsed());
    Ok(100.0 * cpu.as_secs_f64() / wall.as_secs_f64())
}

/// The CPU share (percent of one core) of a thread that does nothing but park for `park` at a
/// time, over `window`: the cost of a timer wake-up on this machine times the wake-ups a
/// second, which any server that looks at a silent mailbox every `park` pays. The floor of
/// the silent-kernel row, measured in the same run.
pub fn park_floor(park: Duration, window: Duration) -> Result<f64, String> {
    let parking = thread::spawn(move || {
        // Where the servers' workers run, whose floor this is (a thread spawned by the client
        // would run on the client's CPU).
        pin_server(0);
        let own = "/proc/thread-self/schedstat";
        let (cpu, wall) = (schedstat(own)?, Instant::now());
        while wall.elapsed() < window {
            thread::park_timeout(park);
        }
        let cpu = schedstat(own)? - cpu;
        Ok(100.0 * cpu.as_secs_f64() / wall.elapsed().as_secs_f64())
    });
    parking
        .join()
        .map_err(|_| "park floor: the thread panicked".to_string())?
}

/// The latency (µs) of the first TEST_INCREMENT after `silence` without any request, `samples`
/// times, the caller holding the server serving.
///
/// The request must come at a moment unrelated to the server's timed parks: a plain sleep ends
/// on a timer interrupt, often the very one that ends the server's park (the kernel coalesces
/// timers within their slack), which would flatter the figure. So the client sleeps most of a
/// long silence, then spins to a pseudo-random instant up to half the silence later (at most
/// 500 µs).
pub fn wake(setup: &Setup, silence: Duration, samples: usize) -> Result<Vec<f64>, String> {
    let client = setup.client();
    let mut out = Vec::with_capacity(samples);
    let mut seed = 0x2545_F491_4F6C_DD1D_u64;
    let jitter = (silence / 2).min(Duration::from_micros(500)).as_nanos() as u64;
    increment(&client, 0, 1, 0)?;
    for x in 0..samples as u64 {
        let quiet = Instant::now();
        if silence > Duration::from_millis(2) {
            thread::sleep(silence - Duration::from_millis(1));
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let until = silence + Duration::from_nanos(seed % jitter.max(1));
        while quiet.elapsed() < until {
            std::hint::spin_loop();
        }
        let start = Instant::now();
        increment(&client, 0, 1, x)?;
        out.push(start.elapsed().as_nanos() as f64 / 1e3);
    }
    Ok(out)
}

/// The loaded regime: a thread that keeps a CPU busy until dropped (deliberately no back-off:
/// it stands for another program's work on the other core).
pub struct Hog {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Hog {
    /// On `cpu` where given.
    pub fn start(cpu: Option<usize>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            // Relaxed: the flag only ends the loop; nothing else is published through it.
            thread::spawn(move || {
                if let Some(cpu) = cpu {
                    crate::pin(0, cpu);
                }
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        Hog {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
