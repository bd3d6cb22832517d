//! printf's test arguments, for format.rs's unit tests and the services' integration tests
//! alike: each argument's C value for the host's `snprintf` and its encoding in the device's
//! argument buffer, and a row ([`row!`]) of a format, its arguments and what the host's
//! `snprintf` prints of them.

// Each includer uses part of it; format.rs's tests include it as a private module.
#![allow(dead_code, unreachable_pub)]

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::vec::Vec;

/// How a test argument goes into the device's argument buffer.
pub enum Enc {
    Four(u32),
    Eight(u64),
    /// A `%s` pointer: the string, or null.
    Str(Option<Vec<u8>>),
}

/// A printf test argument: its C value for the reference `snprintf`, and its encoding.
pub trait TestArg {
    type C;
    fn c(&self) -> Self::C;
    fn enc(&self) -> Enc;
}

macro_rules! test_args {
    ($($name:ident($rust:ty) => $c:ty, |$v:ident| $conv:expr, $enc:expr;)*) => {$(
        pub struct $name(pub $rust);
        impl TestArg for $name {
            type C = $c;
            fn c(&self) -> $c {
                let $v = self.0;
                $conv
            }
            fn enc(&self) -> Enc {
                let $v = self.0;
                $enc
            }
        }
    )*};
}

test_args! {
    I(i32) => c_int, |v| v, Enc::Four(v as u32);
    U(u32) => u32, |v| v, Enc::Four(v);
    L(i64) => i64, |v| v, Enc::Eight(v as u64);
    UL(u64) => u64, |v| v, Enc::Eight(v);
    D(f64) => f64, |v| v, Enc::Eight(v.to_bits());
    Ch(u8) => c_int, |v| c_int::from(v), Enc::Four(u32::from(v));
    P(u64) => *const c_void, |v| std::ptr::without_provenance(v as usize), Enc::Eight(v);
    N(()) => *mut c_int, |_v| SINK.with(|sink| sink.as_ptr().cast()), Enc::Eight(0xdead_beef);
}

std::thread_local! {
    /// Where the reference `snprintf` writes its `%n` counts: 8 bytes, 8-aligned, since a
    /// `%lln` writes a `long long` (a `c_int` here let it write past into the next
    /// thread-local, which crashed the test harness once the thread-locals moved).
    static SINK: Cell<i64> = const { Cell::new(0) };
}

/// A `%s` argument: a string ([`s`]) or null ([`NULL`]).
pub struct S(pub Option<CString>);

/// The `%s` argument `text`.
pub fn s(text: &str) -> S {
    S(Some(CString::new(text).unwrap()))
}

/// A null `%s` argument.
pub const NULL: S = S(None);

impl TestArg for S {
    type C = *const c_char;
    fn c(&self) -> *const c_char {
        self.0.as_ref().map_or(std::ptr::null(), |s| s.as_ptr())
    }
    fn enc(&self) -> Enc {
        Enc::Str(self.0.as_ref().map(|s| s.as_bytes().to_vec()))
    }
}

/// One row: a format, its arguments, and the host's `snprintf` of them.
pub struct Row {
    pub format: &'static CStr,
    pub args: Vec<Enc>,
    pub reference: Vec<u8>,
}

/// `snprintf` into a buffer of the right size.
pub fn snprintf_with(call: impl Fn(*mut c_char, usize) -> c_int) -> Vec<u8> {
    let n = call(std::ptr::null_mut(), 0);
    let mut buf = std::vec![0u8; usize::try_from(n).expect("reference snprintf failed") + 1];
    assert_eq!(call(buf.as_mut_ptr().cast(), buf.len()), n);
    buf.truncate(n as usize);
    buf
}

/// `row!(format [=> reference format]; args...)`: a [`Row`] whose reference is the host's
/// `snprintf` of the format (or of the reference format) with each argument's C value.
#[allow(unused_macros)]
macro_rules! row {
    ($format:expr $(=> $reference:expr)?; $($arg:expr),* $(,)?) => {{
        let format: &'static std::ffi::CStr = $format;
        let reference: &'static std::ffi::CStr = row!(@pick $format $(, $reference)?);
        let reference = snprintf_with(|buf, len| {
            // SAFETY: the format is NUL-terminated; each argument has the C type its
            // conversion expects (the rows are written so); a `%n` pointer is the live
            // thread-local SINK; strings are live or null (which glibc prints as "(null)"),
            // and `buf` holds `len` bytes.
            unsafe { libc::snprintf(buf, len, reference.as_ptr() $(, TestArg::c(&$arg))*) }
        });
        Row { format, args: std::vec![$(TestArg::enc(&$arg)),*], reference }
    }};
    (@pick $format:expr) => { $format };
    (@pick $format:expr, $reference:expr) => { $reference };
}

/// `lane`'s argument buffer (`packed`: no alignment padding), its strings by pointer, and the
/// pointers in format order. Pointers are distinct per lane.
pub fn encode(lane: u32, args: &[Enc], packed: bool) -> (Vec<u8>, HashMap<u64, Vec<u8>>, Vec<u64>) {
    let (mut buf, mut strings, mut pointers) = (Vec::new(), HashMap::new(), Vec::new());
    for arg in args {
        let bytes = match arg {
            Enc::Four(v) => v.to_le_bytes().to_vec(),
            Enc::Eight(v) => v.to_le_bytes().to_vec(),
            Enc::Str(None) => 0u64.to_le_bytes().to_vec(),
            Enc::Str(Some(text)) => {
                let pointer =
                    0x7e00_0000_0000 + (u64::from(lane) << 20) + 0x100 * (strings.len() as u64 + 1);
                strings.insert(pointer, text.clone());
                pointers.push(pointer);
                pointer.to_le_bytes().to_vec()
            }
        };
        while !packed && buf.len() % bytes.len() != 0 {
            buf.push(0xee);
        }
        buf.extend(bytes);
    }
    (buf, strings, pointers)
}
