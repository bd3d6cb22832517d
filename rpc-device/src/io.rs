//! Printing: [`print!`](crate::print), [`println!`](crate::println),
//! [`eprint!`](crate::eprint), [`eprintln!`](crate::eprintln). Each lane formats its text on
//! the device into a bounded buffer ([`LINE_BYTES`]), then the warp sends its lanes' texts
//! together through one port (WRITE_TO_STDOUT / WRITE_TO_STDERR: `send_n` of the bytes, the
//! server's reply the count written), so each lane's line arrives whole and a warp's lines
//! together. A text longer than the buffer goes in several writes, which other lanes' may
//! come between.

use core::fmt::{self, Write};

use rpc_core::protocol::Opcode;

use crate::arch;
use crate::client::Port;

/// Bytes a lane formats before it sends them: a line shorter than this arrives whole.
pub const LINE_BYTES: usize = 256;

/// The host's standard streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The host's stdout.
    Stdout,
    /// The host's stderr.
    Stderr,
}

impl Stream {
    fn opcode(self) -> Opcode {
        match self {
            Stream::Stdout => Opcode::WRITE_TO_STDOUT,
            Stream::Stderr => Opcode::WRITE_TO_STDERR,
        }
    }
}

/// Writes `bytes` to `stream` on the host, as one write per lane (the lanes of `mask`
/// together, each with its own bytes); the bytes the host wrote.
pub fn write(stream: Stream, bytes: &[u8], mask: u64) -> u64 {
    let mut port = Port::open_with(stream.opcode(), mask);
    port.send_n(bytes);
    let mut written = 0;
    port.recv(|packet| written = packet[0]);
    written
}

/// A lane's text being formatted: sent when full and when done.
struct Line {
    stream: Stream,
    bytes: [u8; LINE_BYTES],
    len: usize,
}

impl Line {
    /// Sends the buffer with the lanes of `mask`, every one of which makes this call.
    fn send(&mut self, mask: u64) {
        write(self.stream, &self.bytes[..self.len], mask);
        self.len = 0;
    }
}

impl Write for Line {
    fn write_str(&mut self, mut text: &str) -> fmt::Result {
        while !text.is_empty() {
            if self.len == LINE_BYTES {
                // Only the lanes whose text filled the buffer are here: they send together.
                self.send(arch::active_mask());
            }
            let take = text.len().min(LINE_BYTES - self.len);
            self.bytes[self.len..self.len + take].copy_from_slice(&text.as_bytes()[..take]);
            self.len += take;
            text = &text[take..];
        }
        Ok(())
    }
}

/// Formats `args` and writes them to `stream` (what the macros call).
#[doc(hidden)]
pub fn print_to(stream: Stream, args: fmt::Arguments<'_>) {
    // The lanes that came here together send together, whatever paths formatting took.
    let mask = arch::active_mask();
    let mut line = Line {
        stream,
        bytes: [0; LINE_BYTES],
        len: 0,
    };
    // Writing into the buffer never fails.
    let _ = line.write_fmt(args);
    line.send(mask);
}

/// Prints to the host's stdout, formatted on the device.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::io::print_to($crate::io::Stream::Stdout, format_args!($($arg)*))
    };
}

/// Prints to the host's stdout with a newline; the lane's line arrives whole.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => {
        $crate::io::print_to($crate::io::Stream::Stdout, format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Prints to the host's stderr, formatted on the device.
#[macro_export]
macro_rules! eprint {
    ($($arg:tt)*) => {
        $crate::io::print_to($crate::io::Stream::Stderr, format_args!($($arg)*))
    };
}

/// Prints to the host's stderr with a newline; the lane's line arrives whole.
#[macro_export]
macro_rules! eprintln {
    () => { $crate::eprint!("\n") };
    ($($arg:tt)*) => {
        $crate::io::print_to($crate::io::Stream::Stderr, format_args!("{}\n", format_args!($($arg)*)))
    };
}
