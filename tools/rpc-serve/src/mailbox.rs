//! The memory rpc-serve serves: a shared-memory file named by `--file`, or a sealed memfd.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rpc_core::plugin::SharedRegion;

use crate::sigbus;

/// Where the mailbox lives (`--file PATH` or `--memfd`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// A file rpc-serve creates (or truncates) and other processes map by its path. They may
    /// truncate it too: the SIGBUS handler then ends the serving (see `sigbus`).
    File(PathBuf),
    /// A memfd sealed against shrinking and growing, which other processes of the same user
    /// open as `/proc/PID/fd/N`.
    Memfd,
}

/// The mapped mailbox memory, guarded against truncation while it lives.
pub struct Mapped {
    /// Declared first: fields drop in order, so the guard is gone before the munmap.
    _guard: sigbus::Guard,
    map: memmap2::MmapMut,
    /// Kept open: for a memfd this is the only name the memory has (`/proc/PID/fd/N`).
    _file: File,
}

impl Mapped {
    /// Creates `bytes` of zeroed mailbox memory and maps it; returns it with the path a client
    /// opens to map it too.
    pub fn create(backing: &Backing, bytes: usize) -> Result<(Mapped, PathBuf), String> {
        let (file, path) = match backing {
            Backing::File(path) => (create_file(path, bytes)?, path.clone()),
            Backing::Memfd => {
                let file = create_memfd(bytes).map_err(|e| format!("memfd: {e}"))?;
                let path = PathBuf::from(format!(
                    "/proc/{}/fd/{}",
                    std::process::id(),
                    file.as_raw_fd()
                ));
                (file, path)
            }
        };
        // SAFETY: the memory is ours (just created or truncated). Other processes may write
        // it, which the server tolerates: it only ever reads the mapping through atomics. If
        // they truncate it (a file), the guard below keeps the addresses mapped.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(|e| format!("mmap: {e}"))?;
        // SAFETY: the mapping is page-aligned (an mmap) and stays mapped until the `Mapped`
        // built below drops, which drops the guard first; its contents are a mailbox, only
        // garbage to the server if replaced by zero pages.
        let guard = unsafe { sigbus::guard(map.as_ptr() as *mut u8, map.len()) };
        let mapped = Mapped {
            _guard: guard,
            map,
            _file: file,
        };
        Ok((mapped, path))
    }
}

fn create_file(path: &Path, bytes: usize) -> Result<File, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.set_len(bytes as u64)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(file)
}

/// `memfd_create` with sealing allowed, sized, then sealed so that nobody (we included) can
/// shrink or grow it, nor remove the seals: a client's `ftruncate` fails with EPERM, and the
/// pages behind our mapping can never go away.
fn create_memfd(bytes: usize) -> std::io::Result<File> {
    let name = c"rpc-mailbox";
    // SAFETY: a valid NUL-terminated name and flags; the result is checked.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned open by memfd_create and is owned by nothing else.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(bytes as u64)?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS on an open memfd takes an int argument; the result is checked.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file)
}

// SAFETY: an `mmap` is page-aligned (so 64-byte aligned) and stays mapped at the same address,
// with the same length, while this value lives: if another process truncates the file, the
// SIGBUS handler maps zero pages over the same range (see `sigbus`), so the pointer stays valid
// for reads and writes. This process reads it only through the server's atomic views.
unsafe impl SharedRegion for Mapped {
    fn host_ptr(&self) -> *mut u8 {
        self.map.as_ptr() as *mut u8
    }
    fn device_addr(&self) -> u64 {
        self.map.as_ptr() as u64
    }
    fn len(&self) -> usize {
        self.map.len()
    }
}
