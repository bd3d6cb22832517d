//! The memory rpc-serve serves: a shared-memory file named by `--file` (locked, and only ever
//! one rpc-serve's), or a sealed memfd.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rpc_core::plugin::SharedRegion;
use rpc_core::protocol::Layout;

use crate::sigbus;

/// Where the mailbox lives (`--file PATH [--replace]` or `--memfd`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// A file other processes map by its path (see [`open_file`] for which files rpc-serve
    /// takes). They may truncate it too: the SIGBUS handler then ends the serving (see
    /// `sigbus`).
    File {
        path: PathBuf,
        /// Overwrite an existing file that is not an idle mailbox of the layout.
        replace: bool,
    },
    /// A memfd sealed against shrinking and growing, which other processes of the same user
    /// open as `/proc/PID/fd/N`.
    Memfd,
}

/// Why a mailbox file was not taken.
#[derive(Debug)]
pub enum Refusal {
    /// Another rpc-serve holds the file's lock: it serves this mailbox.
    Busy(String),
    /// A symbolic link, not a regular file, or not an idle mailbox of the layout (without
    /// `--replace`): left as it is.
    NotAMailbox(String),
    /// A system call failed.
    Failed(String),
}

/// A file's identity, `(st_dev, st_ino)`.
pub type FileId = (u64, u64);

/// The mapped mailbox memory, guarded against truncation while it lives.
pub struct Mapped {
    /// Declared first: fields drop in order, so the guard is gone before the munmap.
    _guard: sigbus::Guard,
    map: memmap2::MmapMut,
    /// Kept open: for a memfd this is the only name the memory has (`/proc/PID/fd/N`); for a
    /// file it holds the lock that keeps a second rpc-serve away.
    file: File,
}

/// A mailbox ready to serve.
pub struct Opened {
    pub region: Mapped,
    /// The path a client opens to map it.
    pub path: PathBuf,
    /// The file rpc-serve created for this run (to remove at exit if the path still names
    /// it); `None` for a memfd or a file it was given.
    pub created: Option<FileId>,
}

impl Mapped {
    /// Makes or takes `layout`'s mailbox memory as `backing` says and maps it.
    pub fn create(backing: &Backing, layout: Layout) -> Result<Opened, Refusal> {
        let bytes = layout.total_size();
        let (file, path, created) = match backing {
            Backing::File { path, replace } => {
                let (file, created) = open_file(path, layout, *replace)?;
                let created = if created {
                    Some(identity(&file).map_err(|e| failed(path, e))?)
                } else {
                    None
                };
                (file, path.clone(), created)
            }
            Backing::Memfd => {
                let file =
                    create_memfd(bytes).map_err(|e| Refusal::Failed(format!("memfd: {e}")))?;
                let path = PathBuf::from(format!(
                    "/proc/{}/fd/{}",
                    std::process::id(),
                    file.as_raw_fd()
                ));
                (file, path, None)
            }
        };
        // SAFETY: the memory is ours (just created, sized, or checked as an idle mailbox under
        // our lock). Other processes may write it, which the server tolerates: it only ever
        // reads the mapping through atomics. If they truncate it (a file), the guard below
        // keeps the addresses mapped.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(|e| {
            if let Some(created) = created {
                let _ = remove_created(&path, created);
            }
            Refusal::Failed(format!("mmap: {e}"))
        })?;
        // SAFETY: the mapping is page-aligned (an mmap) and stays mapped until the `Mapped`
        // built below drops, which drops the guard first; its contents are a mailbox, only
        // garbage to the server if replaced by zero pages.
        let guard = unsafe { sigbus::guard(map.as_ptr() as *mut u8, map.len()) };
        let region = Mapped {
            _guard: guard,
            map,
            file,
        };
        Ok(Opened {
            region,
            path,
            created,
        })
    }

    /// The open file behind the mapping.
    pub fn file(&self) -> &File {
        &self.file
    }
}

/// How often [`open_file`] starts again when the path stopped naming the file it locked
/// (another rpc-serve removed it at its exit in between).
const OPEN_TRIES: usize = 3;

/// Opens `path` for the mailbox of `layout`, locked against any other rpc-serve (`flock`,
/// exclusive, not waiting), and says whether it was created. The rule:
/// - a path that does not exist is created, already locked and sized ([`create_whole`]):
///   rpc-serve's own file;
/// - a symbolic link is refused (`O_NOFOLLOW`: the last component only), as is anything but a
///   regular file;
/// - a file whose lock another rpc-serve holds is refused as [`Refusal::Busy`];
/// - an existing regular file is taken as it is only if it is an idle mailbox of `layout`:
///   exactly `layout.total_size()` bytes, and every port's two words 0 or 1 and equal (the
///   client owns every port: no exchange in flight, as a mailbox is after its server served
///   every request, and as a new one is);
/// - any other existing file is left untouched and refused, unless `replace`: then it is
///   truncated and sized (zeroed).
///
/// Only a file it created does rpc-serve remove at exit.
fn open_file(path: &Path, layout: Layout, replace: bool) -> Result<(File, bool), Refusal> {
    for _ in 0..OPEN_TRIES {
        if let Some(file) = create_whole(path, layout)? {
            return Ok((file, true));
        }
        // O_NONBLOCK: a FIFO or device at the path must not hold us in `open`.
        let existing = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(path);
        let file = match existing {
            Ok(file) => file,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(refused(
                    path,
                    "is a symbolic link, which rpc-serve does not follow",
                ))
            }
            // Removed since: start again.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(failed(path, e)),
        };
        let metadata = file.metadata().map_err(|e| failed(path, e))?;
        if !metadata.file_type().is_file() {
            return Err(refused(path, "is not a regular file"));
        }
        lock(&file).map_err(|e| busy_or_failed(path, e))?;
        // The lock is on the file we opened: make sure the path still names it, and not a new
        // file made after its server removed this one.
        let named = std::fs::symlink_metadata(path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        if named != Some((metadata.dev(), metadata.ino())) {
            continue;
        }
        match idle_mailbox(&file, layout) {
            Ok(()) => {}
            Err(why) if !replace => {
                return Err(refused(
                    path,
                    format!(
                        "exists and is not an idle mailbox of this layout ({why}); rpc-serve \
                         leaves it as it is (--replace overwrites it)"
                    ),
                ))
            }
            Err(_) => {
                file.set_len(0)
                    .and_then(|()| file.set_len(layout.total_size() as u64))
                    .map_err(|e| failed(path, e))?;
            }
        }
        return Ok((file, false));
    }
    Err(Refusal::Busy(format!(
        "{}: the file was replaced {OPEN_TRIES} times while rpc-serve locked it",
        path.display()
    )))
}

/// How many times (with parks of 1, 2, ... ms) a file just created the plain way waits for a
/// rival rpc-serve that locked it first to let go.
const RIVAL_WAITS: u64 = 20;

/// Creates the mailbox file at `path` whole, or says `None` if the path exists (as anything,
/// a symbolic link included). The file is made unnamed in PATH's directory (`O_TMPFILE`),
/// locked and sized, and only then named (`linkat` of `/proc/self/fd/N`, which fails if the
/// name exists): no other rpc-serve can find it unlocked or empty. Where the file system has
/// no `O_TMPFILE` (or `/proc` is missing), it is created with `O_CREAT | O_EXCL |
/// O_NOFOLLOW`, then locked and sized: a second rpc-serve starting at that instant may lock it
/// first and find it empty; it refuses it (status 4) and this one waits for its lock.
fn create_whole(path: &Path, layout: Layout) -> Result<Option<File>, Refusal> {
    let size = layout.total_size() as u64;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let unnamed = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir);
    match unnamed {
        Ok(file) => {
            // Nobody else can reach an unnamed file: the lock is ours at once.
            lock(&file)
                .and_then(|()| file.set_len(size))
                .map_err(|e| failed(path, e))?;
            match name(&file, path) {
                Ok(()) => return Ok(Some(file)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
                // No /proc to name it by: the plain way below.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(failed(path, e)),
            }
        }
        // No O_TMPFILE on this file system (or kernel): the plain way below.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
            ) => {}
        Err(e) => return Err(failed(path, e)),
    }
    let fresh = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    let file = match fresh {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
        Err(e) => return Err(failed(path, e)),
    };
    // A rival that opened the name before our lock holds it while it looks: it refuses an
    // empty file and lets go, or serves it (`--replace`). Wait for it a moment (parks of 1, 2,
    // ... 20 ms); still held after that, the file is the rival's.
    let mut locked = lock(&file);
    for pause in 1..=RIVAL_WAITS {
        if !locked
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock)
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(pause));
        locked = lock(&file);
    }
    locked.map_err(|e| busy_or_failed(path, e))?;
    if let Err(e) = file.set_len(size) {
        let _ = std::fs::remove_file(path);
        return Err(failed(path, e));
    }
    Ok(Some(file))
}

/// Gives the unnamed `file` the name `path` (`linkat`, following `/proc/self/fd/N` to the file
/// itself, which needs no privilege); `AlreadyExists` if the name is taken.
fn name(file: &File, path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let from = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    let to = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: two valid NUL-terminated paths; the result is checked.
    let linked = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if linked == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn busy_or_failed(path: &Path, error: std::io::Error) -> Refusal {
    if error.kind() == std::io::ErrorKind::WouldBlock {
        Refusal::Busy(format!(
            "{}: another rpc-serve serves this mailbox (it holds the file's lock)",
            path.display()
        ))
    } else {
        failed(path, error)
    }
}

/// `flock(LOCK_EX | LOCK_NB)`: held by the open file (and its mapping) until rpc-serve exits.
fn lock(file: &File) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on an open descriptor; the result is checked.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Ok if `file` holds an idle mailbox of `layout` (see [`open_file`]), else why not.
fn idle_mailbox(file: &File, layout: Layout) -> Result<(), String> {
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len != layout.total_size() as u64 {
        return Err(format!("{len} bytes, not {}", layout.total_size()));
    }
    let words = |offset: usize| -> Result<Vec<u32>, String> {
        let mut bytes = vec![0; 4 * layout.ports() as usize];
        file.read_exact_at(&mut bytes, offset as u64)
            .map_err(|e| e.to_string())?;
        Ok(bytes
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
            .collect())
    };
    let (primary, secondary) = (words(layout.primary())?, words(layout.secondary())?);
    for (port, (&s, &c)) in primary.iter().zip(&secondary).enumerate() {
        if s > 1 || c > 1 || s != c {
            return Err(format!(
                "port {port}'s words are {s} and {c}, not an idle port's"
            ));
        }
    }
    Ok(())
}

/// The identity of `file`.
fn identity(file: &File) -> std::io::Result<FileId> {
    let metadata = file.metadata()?;
    Ok((metadata.dev(), metadata.ino()))
}

/// Removes the file rpc-serve created at `path`, if the path still names it (`created`); says
/// why not otherwise.
pub fn remove_created(path: &Path, created: FileId) -> Result<(), String> {
    let named = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if (named.dev(), named.ino()) != created {
        return Err("the path names another file now".into());
    }
    std::fs::remove_file(path).map_err(|e| e.to_string())
}

fn refused(path: &Path, why: impl std::fmt::Display) -> Refusal {
    Refusal::NotAMailbox(format!("{}: {why}", path.display()))
}

fn failed(path: &Path, error: std::io::Error) -> Refusal {
    Refusal::Failed(format!("{}: {error}", path.display()))
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
