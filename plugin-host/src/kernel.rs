//! What a kernel sees: its warp, and the calls GPU libc offers, each made through the real
//! client protocol (open a port, send, receive) over the mailbox its image's client object
//! names. Every call is per warp: per-lane values come from closures of the lane index, and
//! results are per lane (index = lane).
//!
//! The same functions serve any client of a mailbox (see `tests/cross_process.rs`), since a
//! [`Warp`] is only a [`Client`] plus a lane mask.

use std::collections::HashMap;
use std::sync::Arc;

use rpc_core::plugin::VendorError;
use rpc_core::protocol::lanes;
use rpc_core::protocol::printf::{parse, place};
use rpc_core::protocol::CallArg;
use rpc_core::protocol::{Client, ClientPort, Dialect, Opcode};
use rpc_core::{Error, PluginError, ProtocolError, Result};

use crate::error::HostError;

/// Streams in the positions where the device passes a tagged `FILE*` (PROTOCOL section 6).
pub use rpc_core::protocol::{STDERR, STDIN, STDOUT};

/// The most bytes a kernel accepts back from the server in one byte string (`recv_n`).
const RECV_BOUND: u64 = 64 << 20;

/// Where printf and write go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The server's stdout (the `*_TO_STDOUT` opcodes).
    Stdout,
    /// The server's stderr (the `*_TO_STDERR` opcodes).
    Stderr,
    /// A handle from `fopen`.
    File(u64),
}

/// A printf argument. The conversion decides how many bytes go on the wire.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    /// A signed integer (`%d`, `%c`, ...): its low bytes, as many as the conversion's size.
    Int(i64),
    /// An unsigned integer (`%u`, `%x`, ...): its low bytes, as many as the conversion's size.
    UInt(u64),
    /// A floating-point value (`%f`, `%e`, ...), passed as the bits of a `double`.
    Double(f64),
    /// `%s`; `None` is a null pointer.
    Str(Option<&'a str>),
    /// `%p` (any pointer-sized value).
    Ptr(u64),
}

/// A kernel: run once per warp.
pub type Kernel = Arc<dyn Fn(&mut Warp<'_>) + Send + Sync>;

/// A kernel that called `exit` or `abort` unwinds with this; the launcher knows it is no failure.
pub(crate) struct KernelEnded;

/// One warp of a running kernel.
pub struct Warp<'a> {
    /// None when the image does not use RPC: every call then fails.
    client: Option<Client<'a>>,
    mask: u64,
    lanes: u32,
    block: u32,
    warp: u32,
    warps_per_block: u32,
    args: &'a [u8],
    /// The device's abort flag (see `Device::abort_launches`): once set, no call opens a port.
    aborted: Option<&'a std::sync::atomic::AtomicBool>,
}

impl<'a> Warp<'a> {
    /// A warp over `client` with the lanes of `mask` active. `block`/`warp` locate it in the grid.
    pub fn new(
        client: Option<Client<'a>>,
        mask: u64,
        lanes: u32,
        (block, warp, warps_per_block): (u32, u32, u32),
        args: &'a [u8],
    ) -> Self {
        Warp {
            client,
            mask,
            lanes,
            block,
            warp,
            warps_per_block,
            args,
            aborted: None,
        }
    }

    /// The warp's calls fail from the moment `aborted` is set (the device was aborted).
    pub(crate) fn with_abort(mut self, aborted: &'a std::sync::atomic::AtomicBool) -> Self {
        self.aborted = Some(aborted);
        self
    }

    fn client(&self) -> Result<&Client<'a>> {
        self.client
            .as_ref()
            .ok_or_else(|| warp_error(HostError::NoRpc))
    }

    /// The active lanes, bit `l` for lane `l`.
    pub fn mask(&self) -> u64 {
        self.mask
    }
    /// `L`.
    pub fn lane_size(&self) -> u32 {
        self.lanes
    }
    /// The warp's block in the grid.
    pub fn block(&self) -> u32 {
        self.block
    }
    /// The warp's index in its block.
    pub fn warp(&self) -> u32 {
        self.warp
    }
    /// Warps per block.
    pub fn warps_per_block(&self) -> u32 {
        self.warps_per_block
    }
    /// The warp's index in the grid.
    pub fn global_warp(&self) -> u32 {
        self.block * self.warps_per_block + self.warp
    }
    /// The kernel's packed argument block.
    pub fn args(&self) -> &'a [u8] {
        self.args
    }
    /// The active lanes.
    pub fn lanes(&self) -> impl Iterator<Item = u32> {
        lanes(self.mask)
    }

    /// Opens a port for any opcode (custom payloads): send and receive on it yourself.
    pub fn open(&self, opcode: Opcode) -> Result<ClientPort<'a>> {
        // Relaxed: a flag on its own; its waits check it too (see the device's `Abortable`).
        if self
            .aborted
            .is_some_and(|flag| flag.load(std::sync::atomic::Ordering::Relaxed))
        {
            return Err(warp_error(HostError::Aborted));
        }
        Ok(self.client()?.open(opcode, self.mask)?)
    }

    /// Sends `buf[0] = value(lane)` for `opcode` and returns each lane's `buf[0]` reply.
    pub fn call(&self, opcode: Opcode, value: impl Fn(u32) -> u64) -> Result<Vec<u64>> {
        let mut port = self.open(opcode)?;
        let mut out = vec![0; 64];
        port.send_and_recv(
            |l, p| p.set_word(0, value(l)),
            |l, p| out[l as usize] = p.word(0),
        )?;
        Ok(out)
    }

    /// A typed call, as LLVM's `rpc::dispatch<opcode, fn>(client, args...)` makes it (PROTOCOL
    /// section 12): `args[lane]` are each lane's arguments (index = lane, the same kinds and
    /// sizes in every active lane), `reply` the return value's size (1 for `void`). Returns
    /// each lane's return value; each pointer argument's bytes are overwritten with what the
    /// host left there.
    pub fn dispatch(
        &self,
        opcode: Opcode,
        args: &mut [Vec<CallArg<'_>>],
        reply: usize,
    ) -> Result<Vec<Vec<u8>>> {
        let mut port = self.open(opcode)?;
        Ok(rpc_core::protocol::dispatch(&mut port, args, reply)?)
    }

    /// `printf` with C semantics, formatted on the host. Each lane passes its own arguments.
    /// Returns each lane's result (bytes printed, or -1).
    pub fn printf<'s>(&self, format: &str, args: impl Fn(u32) -> Vec<Arg<'s>>) -> Result<Vec<i64>> {
        self.fprintf(Target::Stdout, format, args)
    }

    /// `fprintf` to a target.
    pub fn fprintf<'s>(
        &self,
        target: Target,
        format: &str,
        args: impl Fn(u32) -> Vec<Arg<'s>>,
    ) -> Result<Vec<i64>> {
        let calls: Vec<PrintfCall> = (0..64)
            .map(|lane| {
                if self.mask >> lane & 1 == 1 {
                    encode_printf(format, &args(lane), false)
                } else {
                    PrintfCall::default()
                }
            })
            .collect();
        printf(self.client()?, self.mask, target, false, &calls)
    }

    /// Writes each lane's bytes (`fwrite`/`fputs`); returns the bytes written per lane.
    pub fn write(&self, target: Target, data: impl Fn(u32) -> Vec<u8>) -> Result<Vec<u64>> {
        let (opcode, handle) = match target {
            Target::Stdout => (Opcode::WRITE_TO_STDOUT, None),
            Target::Stderr => (Opcode::WRITE_TO_STDERR, None),
            Target::File(handle) => (Opcode::WRITE_TO_STREAM, Some(handle)),
        };
        let mut port = self.open(opcode)?;
        if let Some(handle) = handle {
            port.send(|_, p| p.set_word(0, handle))?;
        }
        send_per_lane(&mut port, self.mask, data)?;
        recv_word0(&mut port)
    }

    /// `puts`: each lane's text and a newline on stdout; bytes written per lane.
    pub fn puts(&self, text: impl Fn(u32) -> String) -> Result<Vec<u64>> {
        let mut port = self.open(Opcode::WRITE_TO_STDOUT_NEWLINE)?;
        send_per_lane(&mut port, self.mask, |l| text(l).into_bytes())?;
        recv_word0(&mut port)
    }

    /// `fopen`; each lane's handle, 0 on failure.
    pub fn fopen(&self, path: impl Fn(u32) -> String, mode: &str) -> Result<Vec<u64>> {
        let mut port = self.open(Opcode::OPEN_FILE)?;
        send_per_lane(&mut port, self.mask, |l| nul_terminated(&path(l)))?;
        let mode = nul_terminated(mode);
        if mode.len() > 64 {
            return Err(ProtocolError::BadLength {
                lane: 0,
                len: mode.len(),
                expected: 64,
            }
            .into());
        }
        port.send(|_, p| p.write_bytes(0, &mode))?;
        recv_word0(&mut port)
    }

    /// `fclose`; each lane's result (0, or EOF as u64).
    pub fn fclose(&self, handle: impl Fn(u32) -> u64) -> Result<Vec<u64>> {
        self.call(Opcode::CLOSE_FILE, handle)
    }

    /// The request both reads of a stream make (`fread`, `fgets`): `opcode` with `buf[0] = n`
    /// bytes at the most and `buf[1]` the lane's (tagged) stream; the port (the reply may go
    /// on) and each lane's bytes.
    fn read(
        &self,
        opcode: Opcode,
        stream: impl Fn(u32) -> u64,
        n: u64,
    ) -> Result<(ClientPort<'a>, Vec<Vec<u8>>)> {
        let mut port = self.open(opcode)?;
        port.send(|l, p| {
            p.set_word(0, n);
            p.set_word(1, stream(l));
        })?;
        let bytes = port.recv_n(RECV_BOUND)?;
        Ok((port, bytes))
    }

    /// `fread` of up to `max` bytes from a (tagged) stream; each lane's bytes.
    pub fn fread(&self, stream: impl Fn(u32) -> u64, max: u64) -> Result<Vec<Vec<u8>>> {
        let (mut port, data) = self.read(Opcode::READ_FROM_STREAM, stream, max)?;
        let counts = recv_word0(&mut port)?;
        Ok(data
            .into_iter()
            .zip(counts)
            .map(|(mut d, n)| {
                d.truncate(n as usize);
                d
            })
            .collect())
    }

    /// `fgets` of at most `count - 1` bytes; each lane's line (without the NUL), None at EOF.
    pub fn fgets(&self, stream: impl Fn(u32) -> u64, count: u64) -> Result<Vec<Option<Vec<u8>>>> {
        let (_, lines) = self.read(Opcode::READ_FGETS, stream, count)?;
        Ok(lines
            .into_iter()
            .map(|mut line| {
                let end = line.iter().position(|&b| b == 0)?;
                line.truncate(end);
                Some(line)
            })
            .collect())
    }

    /// `malloc`: device-accessible memory, 2 MiB aligned; each lane's address, 0 on failure.
    pub fn malloc(&self, size: impl Fn(u32) -> u64) -> Result<Vec<u64>> {
        self.call(Opcode::MALLOC, size)
    }

    /// `free`. No reply comes back.
    pub fn free(&self, addr: impl Fn(u32) -> u64) -> Result<()> {
        Ok(self
            .open(Opcode::FREE)?
            .send(|l, p| p.set_word(0, addr(l)))?)
    }

    /// `exit(status)`: tells the host, then ends this warp (it does not return).
    pub fn exit(&self, status: i32) -> ! {
        let result = self.end(Opcode::EXIT, status);
        if let Err(error) = result {
            log::error!("exit request failed: {error}");
        }
        std::panic::resume_unwind(Box::new(KernelEnded))
    }

    /// `abort()`: tells the host, then ends this warp.
    pub fn abort(&self) -> ! {
        if let Err(error) = self.end(Opcode::ABORT, 0) {
            log::error!("abort request failed: {error}");
        }
        std::panic::resume_unwind(Box::new(KernelEnded))
    }

    /// EXIT/ABORT: send; recv (handshake); send status.
    fn end(&self, opcode: Opcode, status: i32) -> Result<()> {
        let mut port = self.open(opcode)?;
        port.send(|_, _| {})?;
        port.recv(|_, _| {})?;
        Ok(port.send(|_, p| p.set_word(0, status as u32 as u64))?)
    }
}

/// A warp's call that this plugin refuses, as the embedder's error: the host plugin's own
/// error, not the server's (no request reached a server).
fn warp_error(error: HostError) -> Error {
    Error::Plugin(PluginError::Vendor {
        plugin: "host",
        what: "a warp's call",
        source: (Box::new(error) as VendorError).into(),
    })
}

fn nul_terminated(text: &str) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    bytes.push(0);
    bytes
}

fn send_per_lane(
    port: &mut ClientPort<'_>,
    mask: u64,
    data: impl Fn(u32) -> Vec<u8>,
) -> Result<()> {
    let owned: Vec<Vec<u8>> = (0..64)
        .map(|l| {
            if mask >> l & 1 == 1 {
                data(l)
            } else {
                Vec::new()
            }
        })
        .collect();
    let slices: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
    Ok(port.send_n(&slices)?)
}

fn recv_word0(port: &mut ClientPort<'_>) -> Result<Vec<u64>> {
    let mut out = vec![0; 64];
    port.recv(|l, p| out[l as usize] = p.word(0))?;
    Ok(out)
}

/// One lane's printf: the format with its NUL, the raw argument buffer, and the strings behind
/// its `%s` pointers (with their NULs).
#[derive(Clone, Debug, Default)]
pub struct PrintfCall {
    /// The format string, NUL-terminated.
    pub format: Vec<u8>,
    /// The argument buffer as the device passes it (each value in its conversion's size).
    pub args: Vec<u8>,
    /// Each `%s` argument's string with its NUL, keyed by the address passed in `args`.
    pub strings: HashMap<u64, Vec<u8>>,
}

/// Lays out `args` for `format` as a GPU compiler would: each value in the size its conversion
/// takes, `*` widths/precisions as `i32` first, aligned to its size unless `packed` (as the
/// protocol's [`parse`] reads the format, the host C library's way). A `%s` passes the string's
/// address; the string itself goes when the server asks for it.
pub fn encode_printf(format: &str, args: &[Arg<'_>], packed: bool) -> PrintfCall {
    let mut call = PrintfCall {
        format: nul_terminated(format),
        ..PrintfCall::default()
    };
    let mut next = args.iter();
    let put = |call: &mut PrintfCall, size: usize, arg: Option<&Arg<'_>>| {
        let (start, _) = place(call.args.len(), size, packed);
        call.args.resize(start, 0);
        let bits = match arg {
            Some(Arg::Int(v)) => *v as u64,
            Some(Arg::UInt(v)) | Some(Arg::Ptr(v)) => *v,
            Some(Arg::Double(v)) => v.to_bits(),
            Some(Arg::Str(Some(s))) => {
                let addr = s.as_ptr() as u64;
                call.strings.insert(addr, nul_terminated(s));
                addr
            }
            Some(Arg::Str(None)) | None => 0,
        };
        call.args.extend_from_slice(&bits.to_le_bytes()[..size]);
    };
    // Each `*` width and precision, then the value (a malformed spec takes only its `*`s).
    for piece in parse(Dialect::HostC, format.as_bytes()) {
        for size in piece.arg_sizes() {
            put(&mut call, size, next.next());
        }
    }
    call
}

/// The client's side of the printf exchange (PROTOCOL section 7) for the lanes of `mask`.
pub fn printf(
    client: &Client<'_>,
    mask: u64,
    target: Target,
    packed: bool,
    calls: &[PrintfCall],
) -> Result<Vec<i64>> {
    let opcode = match (target, packed) {
        (Target::Stdout, false) => Opcode::PRINTF_TO_STDOUT,
        (Target::Stderr, false) => Opcode::PRINTF_TO_STDERR,
        (Target::File(_), false) => Opcode::PRINTF_TO_STREAM,
        (Target::Stdout, true) => Opcode::PRINTF_TO_STDOUT_PACKED,
        (Target::Stderr, true) => Opcode::PRINTF_TO_STDERR_PACKED,
        (Target::File(_), true) => Opcode::PRINTF_TO_STREAM_PACKED,
    };
    let empty = PrintfCall::default();
    let call = |lane: u32| calls.get(lane as usize).unwrap_or(&empty);
    let mut port = client.open(opcode, mask)?;
    if let Target::File(handle) = target {
        port.send(|_, p| p.set_word(0, handle))?;
    }
    // Per-lane slices on the stack: a request allocates nothing but padding the server asked for.
    let formats: [&[u8]; 64] = std::array::from_fn(|l| call(l as u32).format.as_slice());
    port.send_n(&formats)?;
    let mut sizes = [0usize; 64];
    port.recv(|l, p| sizes[l as usize] = p.word(0) as usize)?;
    // Send exactly what the server asked for, so the script stays in step even if we disagree:
    // a prefix of the lane's buffer, or the buffer padded with zeros where it asks for more.
    let size = |l: usize| sizes[l].min(RECV_BOUND as usize);
    let padded: Vec<(usize, Vec<u8>)> = (0..64)
        .filter(|&l| size(l) > call(l as u32).args.len())
        .map(|l| {
            let mut a = call(l as u32).args.clone();
            a.resize(size(l), 0);
            (l, a)
        })
        .collect();
    let mut args: [&[u8]; 64] = std::array::from_fn(|l| {
        let a = &call(l as u32).args;
        &a[..size(l).min(a.len())]
    });
    for (l, a) in &padded {
        args[*l] = a;
    }
    port.send_n(&args)?;
    loop {
        let mut pointers = [0u64; 64];
        let mut results = [0i64; 64];
        port.recv(|l, p| {
            results[l as usize] = p.word(0) as i64;
            pointers[l as usize] = p.word(1);
        })?;
        if lanes(mask).all(|l| pointers[l as usize] == 0) {
            return Ok(results.to_vec());
        }
        let strings: [&[u8]; 64] = std::array::from_fn(|l| {
            call(l as u32)
                .strings
                .get(&pointers[l])
                .map_or(&[][..], Vec::as_slice)
        });
        port.send_n(&strings)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments go where the server reads them: `*`s first as `i32`s, each value aligned
    /// to its size unless packed, and a spec ending in `%` or a malformed one takes only its
    /// `*`s (a `%5%` once took a value, and unpacked aligned to a size of 0: a panic).
    #[test]
    fn printf_arguments_are_laid_out_as_the_server_reads_them() {
        let args = [Arg::Int(-1), Arg::Int(7), Arg::UInt(1 << 40), Arg::Int(3)];
        let call = encode_printf("%c%*ld|%5%|%*y|", &args, false);
        let mut expected = Vec::new();
        expected.extend_from_slice(&(-1i32).to_le_bytes()); // %c
        expected.extend_from_slice(&7i32.to_le_bytes()); // *
        expected.extend_from_slice(&(1u64 << 40).to_le_bytes()); // %ld, at 8
        expected.extend_from_slice(&3i32.to_le_bytes()); // %*y's *
        assert_eq!(call.args, expected);
        assert_eq!(call.format, b"%c%*ld|%5%|%*y|\0");
        let packed = encode_printf("%c%ld", &[Arg::Int(1), Arg::Int(2)], true);
        assert_eq!(packed.args.len(), 12, "no padding when packed");
    }
}
