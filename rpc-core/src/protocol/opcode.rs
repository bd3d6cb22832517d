//! The opcode table (PROTOCOL section 6): `opcode = class << 24 | n`, append-only.
//!
//! Classes: `'c'` (0x63) for libc, `'o'` (0x6F) for the offload runtime. Opcodes of any other
//! class (except the `LAST` sentinel's 0xFF) are free for user handlers; [`Opcode::user`] builds
//! them in class `'u'` (0x75), the class this project uses for its own examples and tests.

use core::fmt;

/// A 32-bit RPC opcode.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u32);

/// The libc class byte `'c'`.
pub(crate) const LIBC_CLASS: u8 = b'c';
/// The offload runtime's class byte `'o'`.
pub(crate) const OFFLOAD_CLASS: u8 = b'o';
/// The class byte [`Opcode::user`] uses.
pub(crate) const USER_CLASS: u8 = b'u';

macro_rules! opcodes {
    ($($name:ident = $value:expr,)*) => {
        impl Opcode {
            $(
                #[doc = concat!("`", stringify!($name), "` (", stringify!($value), ").")]
                pub const $name: Opcode = Opcode($value);
            )*

            /// Every opcode the table names, in table order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name,)*];

            /// The table's name, if it has one.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($value => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

opcodes! {
    NOOP = 0x6300_0000,
    EXIT = 0x6300_0001,
    WRITE_TO_STDOUT = 0x6300_0002,
    WRITE_TO_STDERR = 0x6300_0003,
    WRITE_TO_STREAM = 0x6300_0004,
    WRITE_TO_STDOUT_NEWLINE = 0x6300_0005,
    READ_FROM_STREAM = 0x6300_0006,
    READ_FGETS = 0x6300_0007,
    OPEN_FILE = 0x6300_0008,
    CLOSE_FILE = 0x6300_0009,
    MALLOC = 0x6300_000A,
    FREE = 0x6300_000B,
    HOST_CALL = 0x6300_000C,
    ABORT = 0x6300_000D,
    FEOF = 0x6300_000E,
    FERROR = 0x6300_000F,
    CLEARERR = 0x6300_0010,
    FSEEK = 0x6300_0011,
    FTELL = 0x6300_0012,
    FFLUSH = 0x6300_0013,
    UNGETC = 0x6300_0014,
    PRINTF_TO_STDOUT = 0x6300_0015,
    PRINTF_TO_STDERR = 0x6300_0016,
    PRINTF_TO_STREAM = 0x6300_0017,
    PRINTF_TO_STDOUT_PACKED = 0x6300_0018,
    PRINTF_TO_STDERR_PACKED = 0x6300_0019,
    PRINTF_TO_STREAM_PACKED = 0x6300_001A,
    REMOVE = 0x6300_001B,
    RENAME = 0x6300_001C,
    SYSTEM = 0x6300_001D,
    TEST_INCREMENT = 0x6300_8000,
    TEST_INTERFACE = 0x6300_8001,
    TEST_STREAM = 0x6300_8002,
    OFFLOAD_HOST_CALL = 0x6F00_0000,
    LAST = 0xFFFF_FFFF,
}

impl Opcode {
    /// The six printf opcodes (to stdout, stderr or a stream; unpacked, then packed), which
    /// one handler serves.
    pub const PRINTF: [Opcode; 6] = [
        Opcode::PRINTF_TO_STDOUT,
        Opcode::PRINTF_TO_STDERR,
        Opcode::PRINTF_TO_STREAM,
        Opcode::PRINTF_TO_STDOUT_PACKED,
        Opcode::PRINTF_TO_STDERR_PACKED,
        Opcode::PRINTF_TO_STREAM_PACKED,
    ];

    /// `class << 24 | n`; `n` keeps its low 24 bits.
    pub const fn new(class: u8, n: u32) -> Opcode {
        Opcode((class as u32) << 24 | (n & 0x00FF_FFFF))
    }
    /// The opcode's position in [`Opcode::ALL`], in constant time (the server's hot path counts
    /// and dispatches by it; a `no_std` build has no server).
    #[cfg(feature = "std")]
    pub(crate) const fn table_index(self) -> Option<usize> {
        match self.0 {
            0x6300_0000..=0x6300_001D => Some((self.0 & 0xFF) as usize),
            0x6300_8000..=0x6300_8002 => Some(30 + (self.0 - 0x6300_8000) as usize),
            0x6F00_0000 => Some(33),
            0xFFFF_FFFF => Some(34),
            _ => None,
        }
    }

    /// A user opcode in class `'u'`.
    pub const fn user(n: u32) -> Opcode {
        Opcode::new(USER_CLASS, n)
    }
    /// The class byte.
    pub const fn class(self) -> u8 {
        (self.0 >> 24) as u8
    }
    /// The number within the class.
    pub const fn number(self) -> u32 {
        self.0 & 0x00FF_FFFF
    }
    /// True for opcodes user handlers may define: any class but libc, offload and the sentinel's.
    pub const fn is_user(self) -> bool {
        !matches!(self.class(), LIBC_CLASS | OFFLOAD_CLASS | 0xFF)
    }

    /// The word every lane's `buf[0]` holds in the reply to each step of an abandoned exchange
    /// of this opcode (PROTOCOL section 11): what LLVM's client reads as its call's failure
    /// wherever it reads a word of the reply. All ones (C's -1 and `EOF`, sign-extended) where 0
    /// would read as success; 1 for FEOF and FERROR ("at end", "in error"); otherwise 0, which
    /// is also the only safe length, size, handle or pointer (printf reads its argument size
    /// from the same word).
    pub const fn failure_word(self) -> u64 {
        match self {
            Opcode::FEOF | Opcode::FERROR => 1,
            Opcode::CLOSE_FILE
            | Opcode::FSEEK
            | Opcode::FTELL
            | Opcode::FFLUSH
            | Opcode::UNGETC
            | Opcode::REMOVE
            | Opcode::RENAME
            | Opcode::SYSTEM
            | Opcode::HOST_CALL
            | Opcode::OFFLOAD_HOST_CALL => u64::MAX,
            _ => 0,
        }
    }
}

/// How an image numbers its opcodes, which its client symbol tells (PROTOCOL section 8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Numbering {
    /// LLVM 20+ (`__llvm_rpc_client`): `class << 24 | n`, the table above.
    #[default]
    Current,
    /// LLVM 19 (`__llvm_libc_rpc_client`, a pointer): a 16-bit header opcode numbered 0, 1,
    /// 2... without a class, in LLVM 19's `rpc_opcodes_t.h` order (NOOP = 0 .. REMOVE = 27,
    /// the same order as the libc class today), and its test opcodes from
    /// `test_rpc_opcodes_t.h`: TEST_NOOP = 0x8000, TEST_INCREMENT = 0x8001, TEST_INTERFACE =
    /// 0x8002, TEST_STREAM = 0x8003 (today's are 0x8000..0x8002).
    Llvm19,
}

impl Numbering {
    /// The current opcode of the number an image of this numbering wrote in its header.
    /// A number LLVM 19 did not have comes out as an unknown opcode (class 0), answered as
    /// every unknown opcode is.
    #[cfg(feature = "std")]
    pub(crate) const fn translate(self, raw: u32) -> Opcode {
        match self {
            Numbering::Current => Opcode(raw),
            Numbering::Llvm19 => {
                // The header field is a u16; the two bytes after it are padding.
                let n = raw & 0xFFFF;
                match n {
                    0..=27 => Opcode::new(LIBC_CLASS, n),
                    0x8001..=0x8003 => Opcode::new(LIBC_CLASS, n - 1),
                    _ => Opcode(n),
                }
            }
        }
    }
}

/// The stream handle of stdin, where the device passes a `FILE *` (PROTOCOL section 6): in a
/// *tagged* position (every stream opcode but WRITE_TO_STREAM, CLOSE_FILE and
/// PRINTF_TO_STREAM) the two low bits name a standard stream, in a *raw* one exactly this value.
pub const STDIN: u64 = 1;
/// The stream handle of stdout (see [`STDIN`]).
pub const STDOUT: u64 = 2;
/// The stream handle of stderr (see [`STDIN`]).
pub const STDERR: u64 = 3;

/// Whose printf the output matches (an image prints what LLVM's own loader of its generation
/// prints: see `services::printf`; both read a format alike but for `%n` and `%q`, see
/// [`printf::parse`](super::printf::parse)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// The host C library's, as LLVM 23+'s server prints (it hands each spec to `fprintf`).
    #[default]
    HostC,
    /// LLVM libc's printf core, as LLVM 19-22's servers print, where it differs from glibc
    /// on what a GPU can pass: a null `%p` is `(nullptr)` (padded to the width), and a null
    /// `%s` is `(null)` cut to the precision (`%.3s` prints `(nu`); a spec the core does not
    /// know (`%y`, `%m`, positional `%1$d`, and `%n`, built out of LLVM's server) prints as its
    /// text. (LLVM 22's reordering of null and fetched `%s` strings and its 16-byte `%Lf` are
    /// bugs not copied: docs/llvm-compat.md.)
    LlvmLibc,
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({:#010x})", self.0),
            None => {
                let class = self.class();
                if class.is_ascii_graphic() {
                    write!(
                        f,
                        "{:#010x} (class '{}', n={})",
                        self.0,
                        class as char,
                        self.number()
                    )
                } else {
                    write!(
                        f,
                        "{:#010x} (class {class:#04x}, n={})",
                        self.0,
                        self.number()
                    )
                }
            }
        }
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl From<u32> for Opcode {
    fn from(value: u32) -> Self {
        Opcode(value)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn libc_opcodes_are_class_c_and_numbered_in_order() {
        let libc: std::vec::Vec<_> = Opcode::ALL
            .iter()
            .filter(|o| o.class() == LIBC_CLASS)
            .collect();
        for (n, op) in libc.iter().take(30).enumerate() {
            assert_eq!(op.number(), n as u32, "{op}");
        }
        assert_eq!(Opcode::TEST_INCREMENT, Opcode::new(b'c', 0x8000));
        assert_eq!(Opcode::TEST_STREAM.0, 0x6300_8002);
        assert_eq!(Opcode::OFFLOAD_HOST_CALL, Opcode::new(b'o', 0));
        assert_eq!(Opcode::PRINTF_TO_STREAM_PACKED.0, 0x6300_001A);
        assert_eq!(Opcode::SYSTEM.0, 0x6300_001D);
        assert_eq!(Opcode::ALL.len(), 35);
    }

    #[test]
    fn table_index_is_the_position_in_all() {
        for (i, op) in Opcode::ALL.iter().enumerate() {
            assert_eq!(op.table_index(), Some(i), "{op}");
        }
        for op in [
            0x6300_001E,
            0x6300_7FFF,
            0x6300_8003,
            0x6F00_0001,
            0x7500_0000,
            0,
        ] {
            assert_eq!(Opcode(op).table_index(), None, "{op:#x}");
        }
    }

    #[test]
    fn llvm19_numbers_map_onto_the_current_table() {
        let n = Numbering::Llvm19;
        assert_eq!(n.translate(0), Opcode::NOOP);
        assert_eq!(n.translate(1), Opcode::EXIT);
        assert_eq!(n.translate(7), Opcode::READ_FGETS);
        assert_eq!(n.translate(21), Opcode::PRINTF_TO_STDOUT);
        assert_eq!(n.translate(26), Opcode::PRINTF_TO_STREAM_PACKED);
        assert_eq!(n.translate(27), Opcode::REMOVE);
        assert_eq!(n.translate(0x8001), Opcode::TEST_INCREMENT);
        assert_eq!(n.translate(0x8002), Opcode::TEST_INTERFACE);
        assert_eq!(n.translate(0x8003), Opcode::TEST_STREAM);
        // Padding above the u16 is ignored; numbers 19 did not have stay unknown.
        assert_eq!(n.translate(0xABCD_0002), Opcode::WRITE_TO_STDOUT);
        assert_eq!(n.translate(28).table_index(), None);
        assert_eq!(n.translate(0x8000).table_index(), None);
        assert_eq!(
            Numbering::Current.translate(0x6300_0002),
            Opcode::WRITE_TO_STDOUT
        );
    }

    #[test]
    fn names_and_display() {
        assert_eq!(Opcode::EXIT.name(), Some("EXIT"));
        assert_eq!(
            Opcode::WRITE_TO_STDOUT.to_string(),
            "WRITE_TO_STDOUT (0x63000002)"
        );
        assert_eq!(Opcode::user(7).to_string(), "0x75000007 (class 'u', n=7)");
        assert_eq!(
            Opcode(0x0100_0002).to_string(),
            "0x01000002 (class 0x01, n=2)"
        );
    }

    #[test]
    fn user_range() {
        assert!(Opcode::user(1).is_user());
        assert!(!Opcode::NOOP.is_user());
        assert!(!Opcode::OFFLOAD_HOST_CALL.is_user());
        assert!(!Opcode::LAST.is_user());
        assert_eq!(
            Opcode::user(0x0100_0001).number(),
            1,
            "n keeps its low 24 bits"
        );
    }
}
