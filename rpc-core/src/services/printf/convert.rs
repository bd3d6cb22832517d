//! One conversion as the dialect's printf prints it: a spec with its arguments read
//! ([`Resolved`]), appended to the line being formatted. The host C library's `snprintf`
//! prints most (each call bounded: fields clamped, the spec rebuilt here), except what is
//! written here: `%b`/`%B`, `%n` (nothing), LLVM libc's null `%p` and `%s`, and the plain
//! conversions (no flags, width or precision), whose digits or bytes are all C prints.

use std::ffi::{c_char, c_double, c_int, c_longlong, c_uint, c_ulonglong, c_void, CStr, CString};
use std::io::Write as _;
use std::vec::Vec;

use crate::protocol::printf::{Flags, Length, Spec};
use crate::protocol::Dialect;

/// One specification with its arguments read and its `*`s resolved.
pub(super) struct Resolved<'s> {
    pub(super) spec: &'s Spec,
    pub(super) flags: Flags,
    pub(super) width: Option<usize>,
    pub(super) precision: Option<usize>,
    /// The `*` values as sent, in order (a malformed spec hands them on unchanged).
    pub(super) stars: [Option<i32>; 2],
    /// The value's bytes, zero-extended.
    pub(super) value: u64,
}

/// `text` padded with spaces to `a`'s width (left-justified with `-`).
fn padded(out: &mut Vec<u8>, a: &Resolved, text: &[u8]) {
    let pad = a.width.unwrap_or(0).saturating_sub(text.len());
    if !a.flags.left {
        out.resize(out.len() + pad, b' ');
    }
    out.extend_from_slice(text);
    if a.flags.left {
        out.resize(out.len() + pad, b' ');
    }
}

/// Appends one conversion.
pub(super) fn convert<'s>(
    dialect: Dialect,
    out: &mut Vec<u8>,
    a: &Resolved,
    strings: &dyn Fn(u64) -> Option<&'s [u8]>,
) {
    let (v, wide) = (a.value, a.spec.length.wide());
    match (dialect, a.spec.conversion) {
        // LLVM libc: `ptr_converter.h` and `string_converter.h`.
        (Dialect::LlvmLibc, b'p') if v == 0 => return padded(out, a, b"(nullptr)"),
        (Dialect::LlvmLibc, b's') if v == 0 => {
            let null = b"(null)";
            let shown = a.precision.map_or(null.len(), |p| p.min(null.len()));
            return padded(out, a, &null[..shown]);
        }
        _ => {}
    }
    match a.spec.conversion {
        b'n' => {}
        // Flags, width and precision do nothing to it (glibc, LLVM).
        b'%' => out.push(b'%'),
        b'b' | b'B' => binary(out, a),
        b's' => {
            let fetched = if v == 0 { None } else { strings(v) };
            let missing = match a.precision {
                Some(p) if p < 6 => c"",
                _ => c"(null)",
            };
            // A string ends at its first NUL; one sent without any is copied to add one.
            let copied;
            let text = match fetched {
                None => missing,
                Some(bytes) => match CStr::from_bytes_until_nul(bytes) {
                    Ok(text) => text,
                    Err(_) => {
                        copied = CString::new(bytes).unwrap_or_default();
                        copied.as_c_str()
                    }
                },
            };
            c_format(out, a, CValue::Str(text));
        }
        b'p' => c_format(
            out,
            a,
            CValue::Ptr(std::ptr::without_provenance(v as usize)),
        ),
        b'f' | b'F' | b'e' | b'E' | b'g' | b'G' | b'a' | b'A' => {
            c_format(out, a, CValue::Double(f64::from_bits(v)))
        }
        b'd' | b'i' if wide => c_format(out, a, CValue::LongLong(v as i64)),
        b'o' | b'u' | b'x' | b'X' if wide => c_format(out, a, CValue::ULongLong(v)),
        b'o' | b'u' | b'x' | b'X' => c_format(out, a, CValue::UInt(v as u32)),
        // d, i (4 bytes) and c.
        _ => c_format(out, a, CValue::Int(v as u32 as i32)),
    }
}

/// A value handed to `snprintf`, with its C type.
#[derive(Clone, Copy)]
enum CValue<'a> {
    Int(c_int),
    UInt(c_uint),
    LongLong(c_longlong),
    ULongLong(c_ulonglong),
    Double(c_double),
    /// Printed by `%p` only, never dereferenced.
    Ptr(*const c_void),
    Str(&'a CStr),
}

/// Appends a conversion with no flags, width or precision, of an integer of its C type, a
/// character or a string, if it is one: then C prints exactly its digits (a `-` and the
/// magnitude's digits in the conversion's base), or its bytes, written here, and the call to
/// `snprintf`, the costliest part of a short printf, is saved. Returns whether it was one.
fn plain(out: &mut Vec<u8>, a: &Resolved, value: CValue) -> bool {
    if a.flags != Flags::default() || a.width.unwrap_or(0) != 0 || a.precision.is_some() {
        return false;
    }
    // `h` and `hh` truncate first, which snprintf does; only the full C types come here.
    let full = matches!(a.spec.length, Length::None)
        || matches!(value, CValue::LongLong(_) | CValue::ULongLong(_));
    let (negative, magnitude) = match (value, a.spec.conversion) {
        (CValue::Int(v), b'c') => {
            out.push(v as u8); // C prints the int as an unsigned char, a NUL included.
            return true;
        }
        (CValue::Str(text), _) => {
            out.extend_from_slice(text.to_bytes());
            return true;
        }
        (_, _) if !full => return false,
        (CValue::Int(v), _) => (v < 0, u64::from(v.unsigned_abs())),
        (CValue::LongLong(v), _) => (v < 0, v.unsigned_abs()),
        (CValue::UInt(v), _) => (false, u64::from(v)),
        (CValue::ULongLong(v), _) => (false, v),
        _ => return false,
    };
    if !matches!(a.spec.conversion, b'd' | b'i' | b'u' | b'x' | b'X' | b'o') {
        return false;
    }
    push_integer(out, a.spec.conversion, negative, magnitude);
    true
}

/// Appends an integer as a plain conversion prints it: a `-` if `negative`, then the
/// magnitude's digits in the base of `conversion` (one of `d i u x X o`).
pub(super) fn push_integer(out: &mut Vec<u8>, conversion: u8, negative: bool, magnitude: u64) {
    if negative {
        out.push(b'-');
    }
    match conversion {
        b'x' => push_digits::<16>(out, magnitude, b"0123456789abcdef"),
        b'X' => push_digits::<16>(out, magnitude, b"0123456789ABCDEF"),
        b'o' => push_digits::<8>(out, magnitude, b"01234567"),
        _ => push_digits::<10>(out, magnitude, b"0123456789"),
    }
}

/// Appends `value`'s digits in base `RADIX` (a constant, so the divisions are multiplications).
fn push_digits<const RADIX: u64>(out: &mut Vec<u8>, value: u64, digits: &[u8]) {
    // Last first, into a buffer as long as the longest number (22 octal digits of 2^64 - 1).
    let mut buf = [0u8; 22];
    let mut start = buf.len();
    let mut rest = value;
    loop {
        start -= 1;
        buf[start] = digits[(rest % RADIX) as usize];
        rest /= RADIX;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[start..]);
}
/// Appends `snprintf` of one conversion: `a`'s flags, width and precision, its conversion, and a
/// length modifier chosen here to match `value`'s C type.
fn c_format(out: &mut Vec<u8>, a: &Resolved, value: CValue) {
    let conversion = a.spec.conversion;
    let matches = match value {
        CValue::Int(_) => matches!(conversion, b'd' | b'i' | b'c'),
        CValue::LongLong(_) => matches!(conversion, b'd' | b'i'),
        CValue::UInt(_) | CValue::ULongLong(_) => matches!(conversion, b'o' | b'u' | b'x' | b'X'),
        CValue::Double(_) => b"fFeEgGaA".contains(&conversion),
        CValue::Ptr(_) => conversion == b'p',
        CValue::Str(_) => conversion == b's',
    };
    if !matches {
        return; // Unreachable: `convert` pairs them. Checked here because the call relies on it.
    }
    if plain(out, a, value) {
        return;
    }
    let length: &[u8] = match (value, a.spec.length) {
        (CValue::LongLong(_) | CValue::ULongLong(_), _) => b"ll",
        (CValue::Int(_) | CValue::UInt(_), Length::Hh) if conversion != b'c' => b"hh",
        (CValue::Int(_) | CValue::UInt(_), Length::H) if conversion != b'c' => b"h",
        _ => b"",
    };
    let mut buf = [0u8; 32];
    if !clamped_spec(&mut buf, a, length, conversion) {
        return; // Unreachable (the fields are clamped); a cut spec must never reach snprintf.
    }
    let spec = buf.as_ptr().cast::<c_char>();
    let call = |buf: *mut c_char, len: usize| -> c_int {
        // SAFETY: `spec` is NUL-terminated and holds exactly one conversion (flags, digits and
        // '.' otherwise): `conversion` with `length`, whose C argument type was checked above to
        // be the type of the value passed (int for d/i/c and h/hh, long long for ll, unsigned
        // variants for o/u/x/X, double, void * for %p, which only prints the address, and a live
        // NUL-terminated string for %s). `buf` is valid for writes of `len` bytes.
        unsafe {
            match value {
                CValue::Int(v) => libc::snprintf(buf, len, spec, v),
                CValue::UInt(v) => libc::snprintf(buf, len, spec, v),
                CValue::LongLong(v) => libc::snprintf(buf, len, spec, v),
                CValue::ULongLong(v) => libc::snprintf(buf, len, spec, v),
                CValue::Double(v) => libc::snprintf(buf, len, spec, v),
                CValue::Ptr(v) => libc::snprintf(buf, len, spec, v),
                CValue::Str(v) => libc::snprintf(buf, len, spec, v.as_ptr()),
            }
        }
    };
    // snprintf fails only on what clamped fields rule out: then nothing is printed.
    append_snprintf(out, call);
}

/// Appends what `call(buf, len)`, an `snprintf` into `buf`, prints: into a stack buffer, or
/// again into `out` if that was too short. Nothing if it fails (returns a negative count),
/// as C's `printf` then prints nothing of the conversion either.
fn append_snprintf(out: &mut Vec<u8>, call: impl Fn(*mut c_char, usize) -> c_int) {
    let mut small = [0u8; 256];
    let Ok(n) = usize::try_from(call(small.as_mut_ptr().cast(), small.len())) else {
        return;
    };
    if let Some(text) = small.get(..n) {
        out.extend_from_slice(text);
    } else {
        let start = out.len();
        out.resize(start + n + 1, 0);
        let buf = out.get_mut(start..).unwrap_or_default();
        let complete = call(buf.as_mut_ptr().cast(), buf.len()) == n as c_int;
        out.truncate(start + if complete { n } else { 0 });
    }
}

/// Whether `dialect`'s printf prints a malformed spec ending in `conversion` as its text, as it
/// was written: LLVM 20-22 (LLVM libc's printf core) every one, LLVM 23+ (the host C library)
/// one the format ended in (LLVM's parser writes it as a literal). Else see [`malformed`].
pub(super) fn malformed_as_text(dialect: Dialect, conversion: u8) -> bool {
    dialect == Dialect::LlvmLibc || conversion == 0
}

/// Appends a malformed spec (`text`, as written) as the host C library prints it, one that
/// [`malformed_as_text`] does not take.
///
/// LLVM 23+ hands the text, its `*` values and a zero value to the host's `fprintf`, and so
/// does this with `snprintf`: glibc prints such a spec again in its own form (`%*y` with 3 is
/// `%3y`, `%ll]` is `%]`), without padding, and nothing if it cannot parse it. Two exceptions
/// keep that call safe and bounded: a positional `%N$` prints `%`, what glibc prints for it,
/// without glibc reading N arguments; and glibc's own conversions LLVM does not know, `%m`
/// (errno's message), `%C` and `%S` (of a zero value: a NUL, `(null)`), get clamped fields, as
/// padding is real there.
pub(super) fn malformed(out: &mut Vec<u8>, a: &Resolved, text: &[u8]) {
    let conversion = a.spec.conversion;
    let positional = matches!(text.get(1), Some(b'1'..=b'9')) && conversion == b'$';
    if positional {
        return out.push(b'%');
    }
    if matches!(conversion, b'm' | b'C' | b'S') {
        let mut buf = [0u8; 32];
        if !clamped_spec(&mut buf, a, b"", conversion) {
            return;
        }
        let spec = buf.as_ptr().cast::<c_char>();
        return append_snprintf(out, |buf, len| {
            if conversion == b'm' {
                clear_errno();
            }
            // SAFETY: `spec` is one NUL-terminated conversion, `m` (which takes no argument),
            // `C` (a wint_t: the int 0 is passed) or `S` (a wchar_t pointer: null is passed,
            // which glibc prints as "(null)"), with flags and clamped digits; `buf` is valid
            // for writes of `len` bytes.
            unsafe {
                match conversion {
                    b'S' => libc::snprintf(buf, len, spec, std::ptr::null::<c_void>()),
                    _ => libc::snprintf(buf, len, spec, 0 as c_int),
                }
            }
        });
    }
    let mut spec = text.to_vec();
    spec.push(0);
    let spec = spec.as_ptr().cast::<c_char>();
    let zero: c_ulonglong = 0;
    append_snprintf(out, |buf, len| {
        // SAFETY: `spec` is NUL-terminated: a `%`, flags, digits or `*`s, a `.`, a length and
        // one byte that is none of glibc's conversions (the cases above took `m`, `C`, `S`,
        // and the known ones are no `Malformed`), so glibc reads at most the `*` values,
        // each an int, passed in order, then prints the spec as text; the zero after them is
        // what LLVM passes and is not read. Not positional (taken above), so glibc reads
        // nothing beyond them. `buf` is valid for writes of `len` bytes.
        unsafe {
            match a.stars {
                [Some(w), Some(p)] => libc::snprintf(buf, len, spec, w, p, zero),
                [Some(v), None] | [None, Some(v)] => libc::snprintf(buf, len, spec, v, zero),
                [None, None] => libc::snprintf(buf, len, spec, zero),
            }
        }
    });
}

/// Sets this thread's errno to 0 before a `%m`: a device has no host errno, and LLVM's server
/// prints errno 0's message ("Success" on glibc), not whatever its thread's last failed call
/// left (the server thread's own timeouts, say).
fn clear_errno() {
    // SAFETY: `__errno_location` returns the address of the calling thread's errno, valid and
    // written only by this thread for as long as it lives.
    unsafe { *libc::__errno_location() = 0 };
}

/// Writes into `buf` the NUL-terminated spec of `a`'s flags, its resolved width and precision
/// (clamped, no `*`), `length` and `conversion`. On the stack: at most 19 bytes (`%`, five
/// flags, a width and a precision of at most four digits each, as both are clamped to
/// MAX_FIELD, `.`, `ll`, the conversion and the NUL). Returns whether it fit.
fn clamped_spec(buf: &mut [u8; 32], a: &Resolved, length: &[u8], conversion: u8) -> bool {
    let mut spec = &mut buf[..];
    let f = a.flags;
    let on = [f.left, f.plus, f.space, f.alt, f.zero];
    let flags = b"-+ #0"
        .iter()
        .zip(on)
        .filter_map(|(&c, on)| on.then_some(c));
    let mut written = spec.write_all(b"%").is_ok();
    for flag in flags {
        written &= spec.write_all(&[flag]).is_ok();
    }
    if let Some(width) = a.width.filter(|&w| w > 0) {
        written &= write!(spec, "{width}").is_ok();
    }
    if let Some(precision) = a.precision {
        written &= write!(spec, ".{precision}").is_ok();
    }
    written && spec.write_all(length).is_ok() && spec.write_all(&[conversion, 0]).is_ok()
}

/// `%b` / `%B` as glibc prints them: binary digits, `#` adds `0b`/`0B` before a non-zero value,
/// and width, precision and the `-` and `0` flags work as for `%x`.
fn binary(out: &mut Vec<u8>, a: &Resolved) {
    let value = match a.spec.length {
        Length::Hh => a.value & 0xff,
        Length::H => a.value & 0xffff,
        length if length.wide() => a.value,
        _ => a.value & 0xffff_ffff,
    };
    // No digit at all for a zero value with precision 0, as for %x.
    let bits = (64 - value.leading_zeros()).max(u32::from(a.precision != Some(0)));
    let digits = (0..bits).rev().map(|b| b'0' + ((value >> b) & 1) as u8);
    let digit_count = digits.len();
    let zeros = a.precision.unwrap_or(0).saturating_sub(digit_count);
    let prefix: &[u8] = match (a.flags.alt && value != 0, a.spec.conversion) {
        (false, _) => b"",
        (true, b'B') => b"0B",
        (true, _) => b"0b",
    };
    let width = a.width.unwrap_or(0);
    let pad = width.saturating_sub(prefix.len() + zeros + digit_count);
    let zero_pad = a.flags.zero && !a.flags.left && a.precision.is_none();
    if !a.flags.left && !zero_pad {
        out.resize(out.len() + pad, b' ');
    }
    out.extend_from_slice(prefix);
    let zeros = if zero_pad { zeros + pad } else { zeros };
    out.resize(out.len() + zeros, b'0');
    out.extend(digits);
    if a.flags.left {
        out.resize(out.len() + pad, b' ');
    }
}
