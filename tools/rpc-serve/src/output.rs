//! rpc-serve's own output: writes of its last words that give up at a deadline whatever the
//! reader does. (The device's output is the server's: written without blocking, and what could
//! not be written counted in `output_lost_bytes`.)

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::time::Instant;

/// Writes `bytes` whole to descriptor `fd` (rpc-serve's stdout or stderr, 1 or 2), giving up with
/// `TimedOut` at `deadline` if the reader does not take them.
///
/// Never through std's `Stdout`/`Stderr`: a worker stuck writing the device's output to the
/// same stream holds their lock. A pipe, FIFO or terminal is opened again through
/// `/proc/self/fd/N` with `O_NONBLOCK`: a new open file description, so the flag touches no
/// one else's, and `poll` waits for room until the deadline. A socket is sent to with
/// `MSG_DONTWAIT`. A regular file is written plainly (writing it never waits for a reader);
/// so is anything else when `/proc` cannot reopen it. A write of at most `PIPE_BUF` bytes to a
/// pipe goes in whole or not at all, so a short message never lands split among another
/// writer's bytes.
pub fn write_until(fd: RawFd, bytes: &[u8], deadline: Instant) -> io::Result<()> {
    // SAFETY: `fd` is rpc-serve's stdout or stderr, open for its whole life (std's start-up
    // opens /dev/null on any of 0, 1, 2 found closed, and rpc-serve never closes them); the
    // borrow ends with this call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let file_type = std::fs::metadata(&proc_path)?.file_type();
    if file_type.is_socket() {
        return send_until(fd, bytes, deadline);
    }
    if file_type.is_file() {
        return File::from(fd.try_clone_to_owned()?).write_all(bytes);
    }
    let reopened = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(&proc_path);
    let mut file = match reopened {
        Ok(file) => file,
        // A pipe whose reader is gone: what the write would have said.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        Err(_) => File::from(fd.try_clone_to_owned()?),
    };
    let mut rest = bytes;
    while !rest.is_empty() {
        match file.write(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_writable(file.as_raw_fd(), deadline)?
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// [`write_until`] for a socket: `send` with `MSG_DONTWAIT` (the descriptor's own flags are
/// shared with whoever else holds it, so they stay as they are).
fn send_until(fd: BorrowedFd<'_>, bytes: &[u8], deadline: Instant) -> io::Result<()> {
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: `rest` is valid for `rest.len()` bytes of reading; `fd` is open.
        let sent = unsafe {
            libc::send(
                fd.as_raw_fd(),
                rest.as_ptr().cast(),
                rest.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if let Ok(n) = usize::try_from(sent) {
            rest = &rest[n..];
            continue;
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock => wait_writable(fd.as_raw_fd(), deadline)?,
            _ => return Err(error),
        }
    }
    Ok(())
}

/// Waits until `fd` can take bytes, or fails with `TimedOut` at `deadline`.
fn wait_writable(fd: RawFd, deadline: Instant) -> io::Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "its reader took nothing before the deadline",
            ));
        }
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // Rounded up, so that a wait never ends just short of the deadline and spins.
        let ms = i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX);
        // SAFETY: one valid `pollfd`, for the duration of the call.
        let ready = unsafe { libc::poll(&mut poll, 1, ms) };
        if ready > 0 {
            // Writable, or an error or hang-up the next write reports.
            return Ok(());
        }
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
    }
}
