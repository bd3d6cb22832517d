//! Typed calls, the client's side: what LLVM 23's `rpc::dispatch<OPCODE, fn>(client, args...)`
//! (`libc/shared/rpc_dispatch.h`) sends and receives, for host threads acting as a warp
//! (plugin-host's kernels, tests, the bench). The server's side is `services::typed`; the wire
//! format is PROTOCOL section 12. `no_std` (with `alloc`).
//!
//! Per call, on one port:
//! 1. for each pointer argument, in order: `send_n` of its pointee (0 bytes for NULL), then
//!    `recv` of the host's pointer (word 0), which replaces the argument's value;
//! 2. the packed argument bytes (each argument's bytes back to back, a pointer's 8, at least
//!    one byte), as fixed packets without a length word;
//! 3. for each pointer argument: `recv_n` of its pointee as the host left it, written back
//!    over the caller's memory;
//! 4. the return value as fixed packets (one byte for `void`).

use crate::protocol::error::ProtocolError;
use crate::protocol::port::{lanes, ClientPort};

#[cfg(not(feature = "std"))]
extern crate alloc;
#[cfg(not(feature = "std"))]
use alloc::vec::Vec;
#[cfg(feature = "std")]
use std::vec::Vec;

/// The bytes a pointer takes in the packed argument list (the device's 64-bit pointers).
pub(crate) const POINTER_BYTES: usize = 8;

/// One argument of a typed call, as the client marshals it.
#[derive(Debug)]
pub enum CallArg<'a> {
    /// Passed by value: its bytes, as they lie in memory.
    Value(Vec<u8>),
    /// A pointer to a complete type: the host gets a copy of the pointee and the client gets
    /// back what the host left there (LLVM copies back every pointer, `const` ones too). The
    /// bytes are the pointee as the C client sizes it: an object's `sizeof`, a span's
    /// `n * sizeof(T)`, a `const char *`'s `strlen + 1`. `None` is NULL (0 bytes sent).
    Pointer(Option<&'a mut [u8]>),
}

impl CallArg<'_> {
    /// A value argument from a plain value's bytes.
    pub fn value<T: bytemuck::NoUninit>(value: T) -> Self {
        CallArg::Value(bytemuck::bytes_of(&value).to_vec())
    }

    /// Its bytes in the packed argument list.
    fn wire_size(&self) -> usize {
        match self {
            CallArg::Value(bytes) => bytes.len(),
            CallArg::Pointer(_) => POINTER_BYTES,
        }
    }
}

/// Makes a typed call on an open port: `args[lane]` are each active lane's arguments (every
/// lane the same kinds and sizes, as one C signature gives them), `reply` the size of the
/// return value (1 for `void`). Returns each lane's return value (index = lane; inactive lanes
/// empty); each pointer's pointee is overwritten with what the host sent back, of which at
/// most its own length is taken (a longer answer fails with [`ProtocolError::BadLength`]
/// once the exchange is complete).
pub fn dispatch(
    port: &mut ClientPort<'_>,
    args: &mut [Vec<CallArg<'_>>],
    reply: usize,
) -> Result<Vec<Vec<u8>>, ProtocolError> {
    let mask = port.mask();
    let first = port.first_lane() as usize;
    let shape: Vec<usize> = args
        .get(first)
        .map(|a| a.iter().map(CallArg::wire_size).collect())
        .unwrap_or_default();
    let pointers: Vec<usize> = args
        .get(first)
        .map(|a| {
            a.iter()
                .enumerate()
                .filter(|(_, arg)| matches!(arg, CallArg::Pointer(_)))
                .map(|(i, _)| i)
                .collect()
        })
        .unwrap_or_default();
    for lane in lanes(mask) {
        let same = args.get(lane as usize).is_some_and(|a| {
            a.len() == shape.len()
                && a.iter().zip(&shape).enumerate().all(|(i, (arg, &size))| {
                    arg.wire_size() == size
                        && matches!(arg, CallArg::Pointer(_)) == pointers.contains(&i)
                })
        });
        if !same {
            return Err(ProtocolError::BadLength {
                lane,
                len: args.get(lane as usize).map_or(0, Vec::len),
                expected: shape.len(),
            });
        }
    }
    let pointee = |args: &[Vec<CallArg<'_>>], lane: u32, i: usize| -> usize {
        match args.get(lane as usize).and_then(|a| a.get(i)) {
            Some(CallArg::Pointer(Some(bytes))) => bytes.len(),
            _ => 0,
        }
    };

    // 1. Each pointee, and the host's pointer for it.
    let lane_count = port.lane_size() as usize;
    let mut hosts = vec_of(lane_count * pointers.len(), 0u64);
    for (k, &i) in pointers.iter().enumerate() {
        let data: Vec<&[u8]> = (0..lane_count)
            .map(|lane| match args.get(lane).and_then(|a| a.get(i)) {
                Some(CallArg::Pointer(Some(bytes))) if mask >> lane & 1 == 1 => &bytes[..],
                _ => &[][..],
            })
            .collect();
        port.send_n(&data)?;
        port.recv(|lane, p| hosts[lane as usize * pointers.len() + k] = p.word(0))?;
    }

    // 2. The packed arguments, the host's pointers in place of ours.
    let size = shape.iter().sum::<usize>().max(1);
    let mut packed = vec_of(lane_count * size, 0u8);
    for lane in lanes(mask) {
        let out = &mut packed[lane as usize * size..][..size];
        let mut at = 0;
        let mut k = 0;
        for arg in &args[lane as usize] {
            match arg {
                CallArg::Value(bytes) => out[at..at + bytes.len()].copy_from_slice(bytes),
                CallArg::Pointer(_) => {
                    let host = hosts[lane as usize * pointers.len() + k];
                    out[at..at + POINTER_BYTES].copy_from_slice(&host.to_le_bytes());
                    k += 1;
                }
            }
            at += arg.wire_size();
        }
    }
    let slices: Vec<&[u8]> = packed.chunks(size).collect();
    port.send_fixed(size, &slices)?;

    // 3. Each pointee back, no longer than it went.
    let mut too_long = None;
    for &i in &pointers {
        let bound = lanes(mask)
            .map(|lane| pointee(args, lane, i))
            .max()
            .unwrap_or(0);
        let back = port.recv_n(bound as u64)?;
        for lane in lanes(mask) {
            let got = &back[lane as usize];
            if let Some(CallArg::Pointer(Some(bytes))) =
                args.get_mut(lane as usize).and_then(|a| a.get_mut(i))
            {
                let n = got.len().min(bytes.len());
                bytes[..n].copy_from_slice(&got[..n]);
                if got.len() > bytes.len() {
                    too_long.get_or_insert(ProtocolError::BadLength {
                        lane,
                        len: got.len(),
                        expected: bytes.len(),
                    });
                }
            } else if !got.is_empty() {
                too_long.get_or_insert(ProtocolError::BadLength {
                    lane,
                    len: got.len(),
                    expected: 0,
                });
            }
        }
    }

    // 4. The return value.
    let replies = port.recv_fixed(reply.max(1))?;
    match too_long {
        Some(error) => Err(error),
        None => Ok(replies),
    }
}

fn vec_of<T: Clone>(len: usize, value: T) -> Vec<T> {
    core::iter::repeat_n(value, len).collect()
}
