//! [`File`]: a file on the host, opened, read, written, sought, flushed and closed through the
//! stream opcodes (OPEN_FILE, READ_FROM_STREAM, WRITE_TO_STREAM, FSEEK, FTELL, FFLUSH,
//! CLOSE_FILE; PROTOCOL section 6); [`remove`] and [`rename`] (REMOVE, RENAME); the host
//! program's standard input, [`stdin`]. The host's file policy applies (rpc-run's allows every
//! regular file; `/proc`, `/sys`, `/dev` and special files never). The handle is the host's,
//! an index of its table, never a pointer.
//!
//! Each call is one port for the lanes making it together, each lane with its own file.

use core::ffi::CStr;

use rpc_core::protocol::{Opcode, BUFFER_SIZE, STDIN};

use crate::client::Port;

/// The host refused or failed (a policy's refusal, a missing file, an I/O error); the host
/// logs why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error;

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("the host refused or failed the file operation")
    }
}

/// Where a seek goes from, as C's `fseek` whence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekFrom {
    /// From the start (`SEEK_SET`).
    Start(u64),
    /// From the current position (`SEEK_CUR`).
    Current(i64),
    /// From the end (`SEEK_END`).
    End(i64),
}

/// An open file on the host; closed when dropped (or by [`File::close`], which reports).
#[derive(Debug)]
pub struct File {
    /// The host's handle (low two bits zero: a handle of OPEN_FILE, as a "tagged" stream too).
    handle: u64,
}

/// A C result the host sent as a `u64` word: negative is a failure.
fn result(word: u64) -> Result<u64, Error> {
    if (word as i64) < 0 {
        Err(Error)
    } else {
        Ok(word)
    }
}

/// One exchange of a one-packet request and its one-word reply.
fn call(opcode: Opcode, words: &[u64]) -> u64 {
    let mut port = Port::open(opcode);
    port.send(|packet| packet[..words.len()].copy_from_slice(words));
    let mut reply = 0;
    port.recv(|packet| reply = packet[0]);
    reply
}

impl File {
    /// Opens `path` with C's `mode` (`c"r"`, `c"w+"`, ...; at most 63 bytes).
    pub fn open(path: &CStr, mode: &CStr) -> Result<File, Error> {
        let mode = mode.to_bytes_with_nul();
        if mode.len() > BUFFER_SIZE {
            return Err(Error);
        }
        let mut port = Port::open(Opcode::OPEN_FILE);
        port.send_n(path.to_bytes_with_nul());
        port.send(|packet| {
            for (word, chunk) in packet.iter_mut().zip(mode.chunks(8)) {
                let mut le = [0u8; 8];
                le[..chunk.len()].copy_from_slice(chunk);
                *word = u64::from_le_bytes(le);
            }
        });
        let mut handle = 0;
        port.recv(|packet| handle = packet[0]);
        if handle == 0 {
            Err(Error)
        } else {
            Ok(File { handle })
        }
    }

    /// Writes `bytes`; the count the host wrote.
    pub fn write(&mut self, bytes: &[u8]) -> Result<usize, Error> {
        let mut port = Port::open(Opcode::WRITE_TO_STREAM);
        port.send(|packet| packet[0] = self.handle);
        port.send_n(bytes);
        let mut written = 0;
        port.recv(|packet| written = packet[0]);
        result(written).map(|n| n as usize)
    }

    /// Reads at most `into.len()` bytes into `into`; the count read (0 at the end).
    pub fn read(&mut self, into: &mut [u8]) -> Result<usize, Error> {
        read_from(self.handle, into)
    }

    /// Moves the position; the new one.
    pub fn seek(&mut self, to: SeekFrom) -> Result<u64, Error> {
        let (offset, whence) = match to {
            SeekFrom::Start(at) => (at as i64, 0),
            SeekFrom::Current(by) => (by, 1),
            SeekFrom::End(by) => (by, 2),
        };
        result(call(Opcode::FSEEK, &[self.handle, offset as u64, whence]))?;
        self.tell()
    }

    /// The position.
    pub fn tell(&mut self) -> Result<u64, Error> {
        result(call(Opcode::FTELL, &[self.handle]))
    }

    /// Writes what the host buffers for this file.
    pub fn flush(&mut self) -> Result<(), Error> {
        result(call(Opcode::FFLUSH, &[self.handle])).map(drop)
    }

    /// Closes the file, reporting whether the host's close succeeded.
    pub fn close(mut self) -> Result<(), Error> {
        let handle = core::mem::take(&mut self.handle);
        result(call(Opcode::CLOSE_FILE, &[handle])).map(drop)
    }
}

/// READ_FROM_STREAM of the (tagged) stream `handle`: at most `into.len()` bytes.
fn read_from(handle: u64, into: &mut [u8]) -> Result<usize, Error> {
    let mut port = Port::open(Opcode::READ_FROM_STREAM);
    port.send(|packet| {
        packet[0] = into.len() as u64;
        packet[1] = handle;
    });
    port.recv_n(into);
    let mut read = 0;
    port.recv(|packet| read = packet[0]);
    result(read).map(|n| (n as usize).min(into.len()))
}

/// Removes the file at `path` (C's `remove`), where the host's policy lets it.
pub fn remove(path: &CStr) -> Result<(), Error> {
    let mut port = Port::open(Opcode::REMOVE);
    port.send_n(path.to_bytes_with_nul());
    let mut removed = 0;
    port.recv(|packet| removed = packet[0]);
    result(removed).map(drop)
}

/// Renames the file at `old` to `new` (C's `rename`), where the host's policy lets it.
pub fn rename(old: &CStr, new: &CStr) -> Result<(), Error> {
    let mut port = Port::open(Opcode::RENAME);
    port.send_n(old.to_bytes_with_nul());
    port.send_n(new.to_bytes_with_nul());
    let mut renamed = 0;
    port.recv(|packet| renamed = packet[0]);
    result(renamed).map(drop)
}

/// The host program's standard input, shared by every thread of every kernel: each read takes
/// the next bytes there are, so threads reading together get one piece each, in no set order.
#[derive(Clone, Copy, Debug)]
pub struct Stdin;

/// The host program's standard input.
pub fn stdin() -> Stdin {
    Stdin
}

impl Stdin {
    /// Reads at most `into.len()` bytes into `into`; the count read (0 at the end).
    pub fn read(&mut self, into: &mut [u8]) -> Result<usize, Error> {
        read_from(STDIN, into)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if self.handle != 0 {
            call(Opcode::CLOSE_FILE, &[self.handle]);
        }
    }
}
