//! The host side of GPU `printf` (opcodes `PRINTF_TO_*`, PROTOCOL section 7).
//!
//! The exchange, per lane: the device sends its C format string; the host [`parse`]s it and
//! replies with [`args_size`], the number of bytes of arguments it expects; the device sends that
//! raw argument buffer; the host asks for the strings behind the non-null `%s` pointers
//! ([`string_pointers`]) and finally [`format`]s the output, byte-identical to the host C
//! library's `printf` for the same format and values (each conversion is handed to `snprintf`,
//! except `%b`/`%B`, formatted here, and `%n`, which prints nothing).
//!
//! Argument sizes (LLVM's, the same for every conversion): `%c` 4 bytes; integers `d i o u x X
//! b B` 4 bytes, 8 with a length `l ll j z t q L` (`h`, `hh` stay 4 and truncate when printed);
//! floating `f F e E g G a A` 8 (a double; `L` is printed as a double); `p s n` 8; each `*` width
//! or precision a 4-byte `i32` read before the value, width first. Little-endian. Unpacked
//! buffers align the running offset up to each argument's size first; packed ones have no padding.
//!
//! Robustness (the format and the arguments come from an untrusted GPU): nothing here panics or
//! reads outside the slices it is given. The format ends at its first NUL. A malformed or
//! unsupported specification (including positional `%1$d` and flags other than `-+ #0`) is a
//! [`FormatError`], as is an argument buffer shorter than the format needs. Widths and precisions,
//! written or passed through `*`, are clamped to [`MAX_FIELD`] so one conversion prints at most a
//! few KiB. A null `%s` prints as glibc does: `(null)` if the precision is absent or at least 6,
//! else the empty string (then padded to the width); a non-null `%s` whose string was not fetched
//! (`strings` returned `None`) prints the same way, as if it were null.

use std::ffi::{c_char, c_double, c_int, c_longlong, c_uint, c_ulonglong, c_void, CStr};
use std::fmt;
use std::vec::Vec;

/// The largest width or precision honoured; larger ones (written or through `*`) are clamped.
pub const MAX_FIELD: usize = 4096;

/// One parsed piece of a format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<'f> {
    /// Bytes printed as they are.
    Literal(&'f [u8]),
    /// `%%`.
    Percent,
    /// One conversion specification.
    Spec(Spec),
}

/// The flags of a specification.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    /// `-`
    pub left: bool,
    /// `+`
    pub plus: bool,
    /// ` `
    pub space: bool,
    /// `#`
    pub alt: bool,
    /// `0`
    pub zero: bool,
}

/// A width or a precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Not given.
    None,
    /// Written in the format (already clamped to [`MAX_FIELD`]).
    Fixed(usize),
    /// `*`: an `i32` argument.
    Star,
}

/// A length modifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    None,
    Hh,
    H,
    L,
    Ll,
    J,
    Z,
    T,
    Q,
    /// `L`
    BigL,
}

impl Length {
    /// Whether an integer conversion with this length takes 8 bytes.
    fn wide(self) -> bool {
        !matches!(self, Length::None | Length::Hh | Length::H)
    }
}

/// One conversion specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub flags: Flags,
    pub width: Count,
    pub precision: Count,
    pub length: Length,
    /// The conversion byte, one of `d i o u x X b B c s p n f F e E g G a A`.
    pub conversion: u8,
    /// Offset of the `%` in the format.
    pub at: usize,
    /// The spec as written, from `%` to the conversion inclusive.
    pub raw: Vec<u8>,
}

impl Spec {
    /// Size in bytes of the value argument (after any `*` arguments).
    pub fn value_size(&self) -> usize {
        match self.conversion {
            b'c' => 4,
            b'd' | b'i' | b'o' | b'u' | b'x' | b'X' | b'b' | b'B' if !self.length.wide() => 4,
            _ => 8,
        }
    }
}

/// Why a format or its arguments cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatError {
    /// The format ends inside the specification whose `%` is at byte `at`.
    Unterminated { at: usize },
    /// Byte `at` ends a specification but is no supported conversion.
    UnknownConversion { at: usize, conversion: u8 },
    /// The format needs `needed` bytes of arguments; only `available` were sent.
    MissingArguments { needed: usize, available: usize },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FormatError::Unterminated { at } => {
                write!(f, "unterminated printf conversion starting at byte {at}")
            }
            FormatError::UnknownConversion { at, conversion } => write!(
                f,
                "unknown printf conversion '{}' at byte {at}",
                char::from(conversion).escape_default()
            ),
            FormatError::MissingArguments { needed, available } => write!(
                f,
                "printf format needs {needed} bytes of arguments, only {available} were sent"
            ),
        }
    }
}

impl std::error::Error for FormatError {}

/// Parses `format` (without its trailing NUL; it stops at the first NUL if there is one).
pub fn parse(format: &[u8]) -> Result<Vec<Piece<'_>>, FormatError> {
    let format = format.split(|&b| b == 0).next().unwrap_or_default();
    let mut pieces = Vec::new();
    let mut rest = format;
    let mut at = 0;
    while !rest.is_empty() {
        let Some(pos) = rest.iter().position(|&b| b == b'%') else {
            pieces.push(Piece::Literal(rest));
            break;
        };
        let (literal, spec) = rest.split_at(pos);
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        at += pos;
        let used = if spec.get(1) == Some(&b'%') {
            pieces.push(Piece::Percent);
            2
        } else {
            let parsed = parse_spec(spec, at)?;
            let used = parsed.raw.len();
            pieces.push(Piece::Spec(parsed));
            used
        };
        at += used;
        rest = spec.get(used..).unwrap_or_default();
    }
    Ok(pieces)
}

/// Parses the specification at the start of `s` (which starts with `%`, at byte `at` of the
/// format).
fn parse_spec(s: &[u8], at: usize) -> Result<Spec, FormatError> {
    let byte = |i: usize| s.get(i).copied().ok_or(FormatError::Unterminated { at });
    let mut i = 1;
    let mut flags = Flags::default();
    loop {
        match byte(i)? {
            b'-' => flags.left = true,
            b'+' => flags.plus = true,
            b' ' => flags.space = true,
            b'#' => flags.alt = true,
            b'0' => flags.zero = true,
            _ => break,
        }
        i += 1;
    }
    let width = parse_count(s, &mut i);
    let precision = if byte(i)? == b'.' {
        i += 1;
        match parse_count(s, &mut i) {
            Count::None => Count::Fixed(0),
            count => count,
        }
    } else {
        Count::None
    };
    let (length, len) = match (byte(i)?, s.get(i + 1)) {
        (b'h', Some(b'h')) => (Length::Hh, 2),
        (b'l', Some(b'l')) => (Length::Ll, 2),
        (b'h', _) => (Length::H, 1),
        (b'l', _) => (Length::L, 1),
        (b'j', _) => (Length::J, 1),
        (b'z', _) => (Length::Z, 1),
        (b't', _) => (Length::T, 1),
        (b'q', _) => (Length::Q, 1),
        (b'L', _) => (Length::BigL, 1),
        _ => (Length::None, 0),
    };
    i += len;
    let conversion = byte(i)?;
    if !b"diouxXbBcspnfFeEgGaA".contains(&conversion) {
        return Err(FormatError::UnknownConversion { at: at + i, conversion });
    }
    let raw = s.get(..=i).unwrap_or_default().to_vec();
    Ok(Spec { flags, width, precision, length, conversion, at, raw })
}

/// Parses `*` or decimal digits at `s[*i..]` (clamped to [`MAX_FIELD`]), advancing `i`.
fn parse_count(s: &[u8], i: &mut usize) -> Count {
    if s.get(*i) == Some(&b'*') {
        *i += 1;
        return Count::Star;
    }
    let mut value: Option<usize> = None;
    while let Some(digit @ b'0'..=b'9') = s.get(*i).copied() {
        let v = value.unwrap_or(0).saturating_mul(10).saturating_add(usize::from(digit - b'0'));
        value = Some(v.min(MAX_FIELD));
        *i += 1;
    }
    value.map_or(Count::None, Count::Fixed)
}

/// Where the next argument of `size` bytes lies: `(start, end)` (saturating; never panics).
fn place(offset: usize, size: usize, packed: bool) -> (usize, usize) {
    let start = if packed {
        offset
    } else {
        offset.checked_next_multiple_of(size).unwrap_or(usize::MAX)
    };
    (start, start.saturating_add(size))
}

/// The sizes of the arguments a piece takes, in order (`*` width, `*` precision, value).
fn arg_sizes(piece: &Piece) -> impl Iterator<Item = usize> {
    let spec = match piece {
        Piece::Spec(spec) => Some(spec),
        _ => None,
    };
    let star = |count: Count| (count == Count::Star).then_some(4);
    let stars = spec.into_iter().flat_map(move |s| [star(s.width), star(s.precision)]).flatten();
    stars.chain(spec.map(Spec::value_size))
}

/// Size in bytes of the argument buffer the format needs (`packed`: no alignment padding).
pub fn args_size(pieces: &[Piece], packed: bool) -> usize {
    pieces.iter().flat_map(arg_sizes).fold(0, |offset, size| place(offset, size, packed).1)
}

/// One specification with its arguments read and its `*`s resolved.
struct Resolved<'s> {
    spec: &'s Spec,
    flags: Flags,
    width: Option<usize>,
    precision: Option<usize>,
    /// The value's bytes, zero-extended.
    value: u64,
}

/// Reads the arguments of every specification in order and hands each to `visit`.
fn walk<'s>(
    pieces: &'s [Piece],
    args: &[u8],
    packed: bool,
    mut visit: impl FnMut(Option<Resolved<'s>>, &'s Piece),
) -> Result<(), FormatError> {
    let mut offset = 0;
    let mut take = |size: usize| -> Result<u64, FormatError> {
        let (start, end) = place(offset, size, packed);
        let Some(bytes) = args.get(start..end) else {
            let needed = args_size(pieces, packed);
            return Err(FormatError::MissingArguments { needed, available: args.len() });
        };
        offset = end;
        let mut word = [0u8; 8];
        word.iter_mut().zip(bytes).for_each(|(w, b)| *w = *b);
        Ok(u64::from_le_bytes(word))
    };
    for piece in pieces {
        let Piece::Spec(spec) = piece else {
            visit(None, piece);
            continue;
        };
        let mut flags = spec.flags;
        let width = match spec.width {
            Count::None => None,
            Count::Fixed(n) => Some(n),
            Count::Star => {
                let w = take(4)? as u32 as i32;
                flags.left |= w < 0;
                Some((w.unsigned_abs() as usize).min(MAX_FIELD))
            }
        };
        let precision = match spec.precision {
            Count::None => None,
            Count::Fixed(n) => Some(n),
            // A negative precision is taken as if it were absent.
            Count::Star => usize::try_from(take(4)? as u32 as i32).ok().map(|p| p.min(MAX_FIELD)),
        };
        let value = take(spec.value_size())?;
        visit(Some(Resolved { spec, flags, width, precision, value }), piece);
    }
    Ok(())
}

/// The non-null `%s` pointers, in format order, read from `args`.
pub fn string_pointers(pieces: &[Piece], args: &[u8], packed: bool) -> Result<Vec<u64>, FormatError> {
    let mut pointers = Vec::new();
    walk(pieces, args, packed, |arg, _| {
        if let Some(arg) = arg.filter(|a| a.spec.conversion == b's' && a.value != 0) {
            pointers.push(arg.value);
        }
    })?;
    Ok(pointers)
}

/// Formats the pieces with the arguments in `args`, as the host C library's `printf` would.
///
/// `strings(ptr)` returns the bytes of the device string at a non-null `%s` pointer (its NUL, and
/// anything after a NUL, is ignored), or `None` if it was not fetched: that string then prints as
/// a null `%s` does (see the module documentation).
pub fn format(
    pieces: &[Piece],
    args: &[u8],
    packed: bool,
    strings: &dyn Fn(u64) -> Option<Vec<u8>>,
) -> Result<Vec<u8>, FormatError> {
    let mut out = Vec::new();
    walk(pieces, args, packed, |arg, piece| match (arg, piece) {
        (Some(arg), _) => convert(&mut out, &arg, strings),
        (None, Piece::Literal(bytes)) => out.extend_from_slice(bytes),
        (None, _) => out.push(b'%'),
    })?;
    Ok(out)
}

/// Appends one conversion.
fn convert(out: &mut Vec<u8>, a: &Resolved, strings: &dyn Fn(u64) -> Option<Vec<u8>>) {
    let (v, wide) = (a.value, a.spec.length.wide());
    match a.spec.conversion {
        b'n' => {}
        b'b' | b'B' => binary(out, a),
        b's' => {
            let fetched = if v == 0 { None } else { strings(v) };
            let mut text = fetched.unwrap_or_else(|| match a.precision {
                Some(p) if p < 6 => Vec::new(),
                _ => b"(null)".to_vec(),
            });
            text.push(0);
            if let Ok(text) = CStr::from_bytes_until_nul(&text) {
                c_format(out, a, CValue::Str(text));
            }
        }
        b'p' => c_format(out, a, CValue::Ptr(std::ptr::without_provenance(v as usize))),
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
    let length: &[u8] = match (value, a.spec.length) {
        (CValue::LongLong(_) | CValue::ULongLong(_), _) => b"ll",
        (CValue::Int(_) | CValue::UInt(_), Length::Hh) if conversion != b'c' => b"hh",
        (CValue::Int(_) | CValue::UInt(_), Length::H) if conversion != b'c' => b"h",
        _ => b"",
    };
    let mut spec = Vec::with_capacity(24);
    spec.push(b'%');
    let f = a.flags;
    let flags = [(f.left, b'-'), (f.plus, b'+'), (f.space, b' '), (f.alt, b'#'), (f.zero, b'0')];
    spec.extend(flags.iter().filter(|(on, _)| *on).map(|(_, c)| *c));
    if let Some(width) = a.width.filter(|&w| w > 0) {
        push_decimal(&mut spec, width);
    }
    if let Some(precision) = a.precision {
        spec.push(b'.');
        push_decimal(&mut spec, precision);
    }
    spec.extend_from_slice(length);
    spec.extend_from_slice(&[conversion, 0]);
    let spec = spec.as_ptr().cast::<c_char>();
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
    let mut small = [0u8; 256];
    let Ok(n) = usize::try_from(call(small.as_mut_ptr().cast(), small.len())) else {
        return; // snprintf failed (cannot happen with clamped fields): print nothing.
    };
    if let Some(text) = small.get(..n) {
        out.extend_from_slice(text);
    } else {
        let start = out.len();
        out.resize(start + n + 1, 0);
        let written = out.get_mut(start..).map_or(-1, |buf| call(buf.as_mut_ptr().cast(), n + 1));
        out.truncate(if written == n as c_int { start + n } else { start });
    }
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
    let bits = if value == 0 && a.precision == Some(0) { 0 } else { 64 - value.leading_zeros() };
    let digits = (0..bits.max(u32::from(a.precision != Some(0)))).rev().map(|b| b'0' + ((value >> b) & 1) as u8);
    let digit_count = digits.len();
    let zeros = a.precision.unwrap_or(0).saturating_sub(digit_count);
    let prefix: &[u8] = match (a.flags.alt && value != 0, a.spec.conversion) {
        (false, _) => b"",
        (true, b'B') => b"0B",
        (true, _) => b"0b",
    };
    let pad = a.width.unwrap_or(0).saturating_sub(prefix.len() + zeros + digit_count);
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

/// Appends `n` in decimal.
fn push_decimal(out: &mut Vec<u8>, n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        if let Some(d) = digits.get_mut(i) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    out.extend_from_slice(digits.get(i..).unwrap_or_default());
}
