//! The typed test functions `rpc-serve --dispatch-tests` serves (PROTOCOL section 12), class
//! `'d'`, opcode `0x64000000 + n`, for any client of LLVM's `rpc::dispatch` to check itself
//! against, as TEST_INCREMENT does for the libc protocol:
//!
//! | n | C signature | result |
//! |---|---|---|
//! | 0 | `uint64_t add(uint64_t a, uint32_t b)` | `a + b` |
//! | 1 | `double fma3(double x, float y, int8_t z)` | `x * y + z` (two roundings) |
//! | 2 | `uint64_t length(const char *s)` | `strlen(s)`, `UINT64_MAX` for NULL |
//! | 3 | `void negate(int64_t *x)` | `*x = -*x` (copied back) |
//! | 4 | `uint64_t sum(const uint32_t *xs, uint64_t n)`, `xs` a span | the sum of `xs[0..n)` |
//! | 5 | `uint64_t pair_sum(struct Pair { uint32_t a; uint64_t b; } p)` | `a + b` |
//! | 6 | `void ping(void)` | nothing |
//! | 7 | `uint32_t fill(uint32_t *out, uint32_t n, uint32_t v)`, `out` a span | `out[i] = v + i` for `i < n` (copied back), returns `n` |
//!
//! Integer results wrap as C's unsigned arithmetic does; `sum` and `fill` stop at the span's
//! end where `n` claims more.

use core::ffi::CStr;

use crate::protocol::Opcode;
use crate::server::error::ServerError;
use crate::server::RpcServer;
use crate::services::typed::Plain;

/// The class of the typed test functions: `'d'`.
pub(crate) const CLASS: u8 = b'd';

/// The opcode of test function `n` (`0x64000000 + n`).
pub const fn opcode(n: u32) -> Opcode {
    Opcode::new(CLASS, n)
}

/// The test functions' names, by `n`.
pub const NAMES: [&str; 8] = [
    "add", "fma3", "length", "negate", "sum", "pair_sum", "ping", "fill",
];

/// `struct Pair { uint32_t a; uint64_t b; }`, `pair_sum`'s argument (16 bytes, 4 of them
/// padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::AnyBitPattern)]
pub struct Pair {
    /// At offset 0.
    pub a: u32,
    /// At offset 8.
    pub b: u64,
}

impl Plain for Pair {}

/// Registers the eight test functions on `server`.
pub fn register(server: &RpcServer) -> Result<(), ServerError> {
    server.register_typed(opcode(0), |a: u64, b: u32| a.wrapping_add(b.into()))?;
    server.register_typed(opcode(1), |x: f64, y: f32, z: i8| {
        x * f64::from(y) + f64::from(z)
    })?;
    server.register_typed(opcode(2), |s: Option<&CStr>| {
        s.map_or(u64::MAX, |s| s.to_bytes().len() as u64)
    })?;
    server.register_typed(opcode(3), |x: Option<&mut i64>| {
        if let Some(x) = x {
            *x = x.wrapping_neg();
        }
    })?;
    server.register_typed(opcode(4), |xs: Option<&[u32]>, n: u64| {
        let xs = xs.unwrap_or_default();
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        xs.iter().take(n).map(|&x| u64::from(x)).sum::<u64>()
    })?;
    server.register_typed(opcode(5), |p: Pair| u64::from(p.a).wrapping_add(p.b))?;
    server.register_typed(opcode(6), || {})?;
    server.register_typed(opcode(7), |out: Option<&mut [u32]>, n: u32, v: u32| {
        let out = out.unwrap_or_default();
        for (i, x) in out.iter_mut().take(n as usize).enumerate() {
            *x = v.wrapping_add(i as u32);
        }
        n
    })?;
    Ok(())
}
