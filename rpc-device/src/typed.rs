//! Typed calls: a kernel calls a host function by its C signature, in the wire format of LLVM
//! 23's `rpc::dispatch` (PROTOCOL section 12), so one host function (a Rust closure given to
//! `RpcServer::register_typed`) serves a C++ kernel and a Rust one alike.
//!
//! ```ignore
//! // uint32_t fill(uint32_t *out, uint32_t n, uint32_t v), `out` a span
//! let mut out = [0u32; 4];
//! let n = call::<u32>(Opcode(0x6400_0007), &mut [
//!     Arg::slice(&mut out),
//!     Arg::value(&4u32),
//!     Arg::value(&10u32),
//! ]);
//! ```
//!
//! Every lane of the warp makes the call with its own arguments (the same kinds and sizes in
//! every lane, as one C signature gives them) and gets its own result.

use bytemuck::{AnyBitPattern, NoUninit, Pod};
use rpc_core::protocol::BUFFER_SIZE;

use crate::client::{Port, WORDS};
use crate::Opcode;

/// One argument of a typed call.
pub enum Arg<'a> {
    /// Passed by value: its bytes as they lie in memory (a struct with its padding).
    Value(&'a [u8]),
    /// A pointer to data the host gets a copy of and writes back (LLVM copies back every
    /// pointer, `const` ones too): an object, a span (`n * sizeof(T)` bytes) or a C string
    /// with its NUL. `None` is NULL.
    Pointer(Option<&'a mut [u8]>),
}

impl<'a> Arg<'a> {
    /// A value argument.
    pub fn value<T: NoUninit>(value: &'a T) -> Self {
        Arg::Value(bytemuck::bytes_of(value))
    }

    /// A pointer to one object.
    pub fn pointer<T: NoUninit + AnyBitPattern>(object: &'a mut T) -> Self {
        Arg::Pointer(Some(bytemuck::bytes_of_mut(object)))
    }

    /// A span: a pointer to `items.len()` elements.
    pub fn slice<T: NoUninit + AnyBitPattern>(items: &'a mut [T]) -> Self {
        Arg::Pointer(Some(bytemuck::cast_slice_mut(items)))
    }

    /// Its bytes in the packed argument list: a pointer's 8 (the host's pointer).
    fn wire_size(&self) -> usize {
        match self {
            Arg::Value(bytes) => bytes.len(),
            Arg::Pointer(_) => 8,
        }
    }
}

/// The most pointer arguments a call may have.
pub const MAX_POINTERS: usize = 8;

/// Calls the host function registered for `opcode` with `args` (in the C signature's order);
/// its return value (`()` for `void`). Each pointer's data is overwritten with what the host
/// left there. A lane the host refused (a pointee that does not fit the function's type) gets
/// zero and its data unchanged but for what the host sent back (nothing).
///
/// # Panics
/// With more than [`MAX_POINTERS`] pointer arguments.
pub fn call<R: Pod>(opcode: Opcode, args: &mut [Arg<'_>]) -> R {
    let mut port = Port::open(opcode);
    // 1. Each pointee, in order; the host answers with its pointer, which the packed
    //    arguments carry instead of ours.
    let mut host = [0u64; MAX_POINTERS];
    let mut pointers = 0;
    for arg in args.iter() {
        if let Arg::Pointer(data) = arg {
            assert!(pointers < MAX_POINTERS, "more than {MAX_POINTERS} pointers");
            port.send_n(data.as_deref().unwrap_or(&[]));
            port.recv(|packet| host[pointers] = packet[0]);
            pointers += 1;
        }
    }
    // 2. The packed arguments, back to back, at least one byte, as fixed packets.
    let size = args.iter().map(Arg::wire_size).sum::<usize>().max(1);
    let mut packed = Packed {
        args,
        host: &host,
        arg: 0,
        at: 0,
        pointer: 0,
    };
    for _ in 0..size.div_ceil(BUFFER_SIZE) {
        port.send(|packet| packed.fill(packet));
    }
    // 4. What the host left in each pointee.
    for arg in args.iter_mut() {
        if let Arg::Pointer(data) = arg {
            let mut empty = [0u8; 0];
            port.recv_n(data.as_deref_mut().unwrap_or(&mut empty));
        }
    }
    // 5. The return value: its bytes as fixed packets (one byte for `void`).
    let mut reply = R::zeroed();
    let bytes = bytemuck::bytes_of_mut(&mut reply);
    let packets = bytes.len().max(1).div_ceil(BUFFER_SIZE);
    for k in 0..packets {
        port.recv(|packet| {
            let words = packet.iter().flat_map(|w| w.to_le_bytes());
            let start = k * BUFFER_SIZE;
            for (slot, byte) in bytes.iter_mut().skip(start).take(BUFFER_SIZE).zip(words) {
                *slot = byte;
            }
        });
    }
    reply
}

/// The packed argument bytes, handed out a packet at a time.
struct Packed<'p, 'a> {
    args: &'p [Arg<'a>],
    host: &'p [u64; MAX_POINTERS],
    /// The argument and the byte within it the next packet starts at.
    arg: usize,
    at: usize,
    /// Pointers passed so far (the index into `host` of the next).
    pointer: usize,
}

impl Packed<'_, '_> {
    /// Fills `packet` with the next bytes (zeros past the end).
    fn fill(&mut self, packet: &mut [u64; WORDS]) {
        let mut bytes = [0u8; BUFFER_SIZE];
        let mut filled = 0;
        while filled < BUFFER_SIZE && self.arg < self.args.len() {
            let host = self
                .host
                .get(self.pointer)
                .copied()
                .unwrap_or(0)
                .to_le_bytes();
            let source: &[u8] = match &self.args[self.arg] {
                Arg::Value(value) => value,
                Arg::Pointer(_) => &host,
            };
            let take = (source.len() - self.at).min(BUFFER_SIZE - filled);
            bytes[filled..filled + take].copy_from_slice(&source[self.at..self.at + take]);
            filled += take;
            self.at += take;
            if self.at == source.len() {
                if matches!(self.args[self.arg], Arg::Pointer(_)) {
                    self.pointer += 1;
                }
                self.arg += 1;
                self.at = 0;
            }
        }
        for (word, chunk) in packet.iter_mut().zip(bytes.chunks(8)) {
            *word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packed list across packets: values back to back, each pointer as the host's
    /// pointer, no padding, zeros past the end.
    #[test]
    fn packed_arguments_are_back_to_back_with_the_hosts_pointers() {
        let (a, b) = (0x1122_3344_5566_7788u64, [7u8; 60]);
        let mut pointee = [0u8; 3];
        let args = [
            Arg::value(&a),
            Arg::Pointer(Some(&mut pointee)),
            Arg::Value(&b),
        ];
        let mut host = [0u64; MAX_POINTERS];
        host[0] = 0xabcd;
        let mut packed = Packed {
            args: &args,
            host: &host,
            arg: 0,
            at: 0,
            pointer: 0,
        };
        let (mut first, mut second) = ([0u64; WORDS], [0u64; WORDS]);
        packed.fill(&mut first);
        packed.fill(&mut second);
        let bytes: std::vec::Vec<u8> = first
            .iter()
            .chain(&second)
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert_eq!(bytes[..8], a.to_le_bytes());
        assert_eq!(bytes[8..16], 0xabcdu64.to_le_bytes());
        assert_eq!(bytes[16..76], b);
        assert!(bytes[76..].iter().all(|&x| x == 0));
    }
}
