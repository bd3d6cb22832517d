//! The file policy in one place: how a device path becomes an open file descriptor, a removal
//! or a rename under [`FilePolicy`] (DESIGN, "Safety and policy"). OPEN_FILE, REMOVE and
//! RENAME call only [`open`], [`remove`] and [`rename`].
//!
//! # What is never touched, whatever the policy
//! A device that can open `/proc/self/mem` for writing owns the host process (it can seek to the
//! server's own policy on the heap and flip it), so even [`FilePolicy::Allow`] never opens:
//! - anything in `/proc`, `/sys` or `/dev` (but `/dev/null`): refused by the path as written
//!   (made absolute, not resolved) before anything is opened, so `O_CREAT` never creates a file
//!   there; then, on the descriptor actually opened, by its file system (`fstatfs`: proc, sysfs,
//!   debugfs, tracefs, securityfs, cgroup, cgroup2, bpf, devpts, and efivarfs, configfs,
//!   pstore, selinuxfs, smackfs, fusectl, binderfs, nsfs wherever they are mounted), by its
//!   device (`st_dev` of `/dev`'s file system, where `/dev` is a mount of its own) and by its
//!   real path (`/proc/self/fd/N`), so no symbolic link, bind mount or `..` gets there either;
//! - anything but a regular file: directories, FIFOs, sockets, character and block devices
//!   (but `/dev/null`, rdev 1:3). Files are opened with `O_NONBLOCK | O_NOCTTY`, so a FIFO
//!   nobody writes is refused at once instead of blocking an I/O thread, and a terminal never
//!   becomes the server's controlling terminal;
//! - a protected file ([`super::Services::protect_file`]: the mailbox itself), by `(st_dev,
//!   st_ino)`, under any name or hard link.
//!
//! Opening never truncates before the checks: the C mode becomes open flags without `O_TRUNC`,
//! and `w` modes `ftruncate` only a file that passed them. A file that does not exist yet is
//! created in two steps: its directory is resolved and checked (the same checks, for a
//! directory), then the last component alone is created in it with `O_NOFOLLOW`, so a dangling
//! symbolic link never makes the server create its target somewhere else.
//!
//! REMOVE and RENAME resolve each path's directory the same way (`O_PATH | O_DIRECTORY`),
//! check it, and require a plain last component that is not a protected file; then
//! `unlinkat` (again with `AT_REMOVEDIR` on `EISDIR`, as C `remove` does) or `renameat`.
//!
//! # The sandbox
//! Under [`FilePolicy::Sandbox`] every path resolves beneath the directory, held by a
//! descriptor ([`Root`]) opened once when the policy is set: a relative path from it, an
//! absolute path only if it lies inside it (the prefix, the directory's path as it was then, is
//! stripped; any other absolute path is refused). The directory is never looked up by its name
//! again, so a local process that renames it and puts a symbolic link (or another directory) in
//! its place redirects nothing: requests go on acting in the renamed directory. Resolution is the
//! kernel's `openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS` (no `..`, absolute symbolic link or magic link leaves the directory,
//! checked atomically at each step, so renames racing the request cannot lead it outside).
//! Where `openat2` is missing (`ENOSYS`, Linux before 5.6) or filtered (`EPERM` from a container's
//! seccomp profile, `E2BIG`), [`Resolver::Walk`] opens one component at a time with
//! `openat(O_PATH | O_DIRECTORY | O_NOFOLLOW)` and the last with `O_NOFOLLOW`: stricter, it
//! refuses every `..` and every symbolic link.
//!
//! A refusal is [`Denial::Refused`] (a refusal of the request, logged and counted); a system
//! call that fails for an ordinary reason (no such file, permission) is [`Denial::Failed`], the C
//! result the device would get from its own libc.

use std::ffi::{c_int, CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::string::String;
use std::vec::Vec;

use super::streams::{CFile, OpenError};
use super::FilePolicy;
use crate::sync::lock;

/// A file's identity: `(st_dev, st_ino)`.
pub(crate) type FileId = (u64, u64);

/// How a sandbox path is resolved beneath its directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resolver {
    /// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`; [`Resolver::Walk`] where the
    /// kernel lacks `openat2` or a seccomp filter refuses it.
    Openat2,
    /// One `openat(O_PATH | O_DIRECTORY | O_NOFOLLOW)` per directory component, the last
    /// component with `O_NOFOLLOW`; `..` and symbolic links refused.
    Walk,
}

/// Why a file operation has no result.
#[derive(Debug)]
pub(crate) enum Denial {
    /// The policy refuses it: a refusal of the request (logged, counted), the C error value to
    /// the device.
    Refused(String),
    /// The system call failed: an ordinary C result.
    Failed(io::Error),
}

type Outcome<T> = core::result::Result<T, Denial>;

/// What one request runs under: the policy (its sandbox's descriptor) and the protected files,
/// as they were when it came.
#[derive(Clone, Debug)]
pub(crate) struct Rules {
    pub(crate) access: Access,
    pub(crate) protected: Vec<FileId>,
    pub(crate) resolver: Resolver,
}

/// A [`FilePolicy`] made ready for requests: a sandbox's directory opened, once.
#[derive(Clone, Debug)]
pub(crate) enum Access {
    Deny,
    Allow,
    /// The sandbox's directory, or why it could not be opened (every request is then refused).
    /// (std's `Arc`: no part of what the loom models check.)
    Sandbox(core::result::Result<std::sync::Arc<Root>, String>),
}

impl Access {
    /// Opens a sandbox's directory, now: from here on it is held by its descriptor.
    pub(crate) fn of(policy: &FilePolicy) -> Access {
        match policy {
            FilePolicy::Deny => Access::Deny,
            FilePolicy::Allow => Access::Allow,
            FilePolicy::Sandbox(dir) => Access::Sandbox(Root::open(dir).map(std::sync::Arc::new)),
        }
    }
}

/// OPEN_FILE: `path` (without NUL) opened as C `fopen(path, mode)` would open it, if the rules
/// allow it; `mode` has passed `valid_mode` (`r`, `w` or `a`, then `+`, `b`, `x`, `e`). The
/// descriptor is blocking again, and truncated for a `w` mode.
pub(crate) fn open(rules: &Rules, path: &[u8], mode: &[u8]) -> Outcome<OwnedFd> {
    let flags = open_flags(mode);
    let place = Place::new(rules, path, true)?;
    // An existing file is opened without O_CREAT (and without O_TRUNC in any case); only a
    // missing one is created, by its last component in a checked directory. `x` modes create
    // or fail, as C does.
    let existing = if flags & libc::O_EXCL != 0 {
        Err(Denial::Failed(io::Error::from_raw_os_error(libc::ENOENT)))
    } else {
        place.open(rules.resolver, flags & !(libc::O_CREAT | libc::O_EXCL))
    };
    let fd = match existing {
        Err(Denial::Failed(error))
            if error.raw_os_error() == Some(libc::ENOENT) && flags & libc::O_CREAT != 0 =>
        {
            let (dir, name) = place.parent(rules.resolver)?;
            match openat(dir.as_fd(), &name, flags | libc::O_NOFOLLOW) {
                Err(error) if error.raw_os_error() == Some(libc::ELOOP) => {
                    return Err(Denial::Refused(std::format!(
                        "{} is a symbolic link: it is not followed to create a file",
                        shown(path)
                    )))
                }
                result => result.map_err(Denial::Failed)?,
            }
        }
        // Only special files answer ENXIO: a FIFO opened for writing without a reader (with
        // O_NONBLOCK), a socket, a device without its driver.
        Err(Denial::Failed(error)) if error.raw_os_error() == Some(libc::ENXIO) => {
            return Err(refused(
                path,
                "not a regular file (a FIFO, socket or device)",
            ))
        }
        other => other?,
    };
    let st = check_file(fd.as_fd(), &rules.protected).map_err(|why| refused(path, why))?;
    if flags & libc::O_ACCMODE != libc::O_RDONLY && mapped_here(&st) {
        return Err(refused(
            path,
            "mapped into the server's process (its program, a library, a mailbox): not opened \
             for writing",
        ));
    }
    set_blocking(fd.as_fd()).map_err(Denial::Failed)?;
    // `/dev/null` is not truncated (C's O_TRUNC is ignored there; ftruncate would fail).
    if mode.first() == Some(&b'w') && !is_dev_null(&st) {
        // SAFETY: `fd` is an open descriptor owned here; ftruncate has no memory preconditions.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), 0) } != 0 {
            return Err(Denial::Failed(io::Error::last_os_error()));
        }
    }
    Ok(fd)
}

/// REMOVE: C `remove(path)` (a file, or an empty directory), if the rules allow it.
pub(crate) fn remove(rules: &Rules, path: &[u8]) -> Outcome<()> {
    let place = Place::new(rules, path, false)?;
    let (dir, name) = place.parent(rules.resolver)?;
    not_protected(dir.as_fd(), &name, &rules.protected).map_err(|why| refused(path, why))?;
    let unlink = |flags| {
        // SAFETY: `dir` is an open directory descriptor and `name` a NUL-terminated string,
        // both live for the call.
        if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    match unlink(0) {
        Err(error) if error.raw_os_error() == Some(libc::EISDIR) => unlink(libc::AT_REMOVEDIR),
        result => result,
    }
    .map_err(Denial::Failed)
}

/// RENAME: C `rename(old, new)`, if the rules allow both sides.
pub(crate) fn rename(rules: &Rules, old: &[u8], new: &[u8]) -> Outcome<()> {
    let from = Place::new(rules, old, false)?;
    let to = Place::new(rules, new, false)?;
    let (from_dir, from_name) = from.parent(rules.resolver)?;
    let (to_dir, to_name) = to.parent(rules.resolver)?;
    not_protected(from_dir.as_fd(), &from_name, &rules.protected)
        .map_err(|why| refused(old, why))?;
    not_protected(to_dir.as_fd(), &to_name, &rules.protected).map_err(|why| refused(new, why))?;
    // SAFETY: both directories are open descriptors and both names NUL-terminated strings,
    // all live for the call.
    let done = unsafe {
        libc::renameat(
            from_dir.as_raw_fd(),
            from_name.as_ptr(),
            to_dir.as_raw_fd(),
            to_name.as_ptr(),
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(Denial::Failed(io::Error::last_os_error()))
    }
}

/// The open flags of a C mode: no `O_TRUNC` (a `w` mode truncates only once the file passed the
/// checks), `O_NONBLOCK` (a FIFO is refused at once, not waited on), `O_NOCTTY`, `O_CLOEXEC`.
fn open_flags(mode: &[u8]) -> c_int {
    let plus = mode.contains(&b'+');
    let mut flags = match (mode.first(), plus) {
        (Some(b'r'), false) => libc::O_RDONLY,
        (Some(b'r'), true) => libc::O_RDWR,
        (_, false) => libc::O_WRONLY | libc::O_CREAT,
        (_, true) => libc::O_RDWR | libc::O_CREAT,
    };
    if mode.first() == Some(&b'a') {
        flags |= libc::O_APPEND;
    }
    if mode.contains(&b'x') && flags & libc::O_CREAT != 0 {
        flags |= libc::O_EXCL;
    }
    flags | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC
}

/// Where a device path leads, under the request's policy.
enum Place<'a> {
    /// [`FilePolicy::Allow`]: the path as given, against the working directory.
    Host(&'a Path),
    /// [`FilePolicy::Sandbox`]: `rel` beneath the directory.
    Beneath { root: &'a Root, rel: PathBuf },
}

/// The directory of a sandbox, opened when the policy was set and held by its descriptor.
#[derive(Debug)]
pub(crate) struct Root {
    /// Its path as the policy gave it, and its real path then: an absolute device path inside
    /// either is taken as relative to the directory.
    given: PathBuf,
    real: PathBuf,
    fd: OwnedFd,
}

impl<'a> Place<'a> {
    /// The place of `path` (a device path without NUL), refused where the policy or the
    /// never-list (by the path as written) refuses it. `opening`: `/dev/null` passes.
    fn new(rules: &'a Rules, path: &'a [u8], opening: bool) -> Outcome<Place<'a>> {
        let host = Path::new(OsStr::from_bytes(path));
        let (place, absolute) = match &rules.access {
            Access::Deny => {
                return Err(Denial::Refused(
                    "file access is denied by the server's policy".into(),
                ))
            }
            Access::Allow => {
                let absolute = match std::env::current_dir() {
                    Ok(cwd) => Some(cwd.join(host)),
                    Err(_) => host.is_absolute().then(|| host.to_path_buf()),
                };
                (Place::Host(host), absolute)
            }
            Access::Sandbox(root) => {
                let root = root.as_ref().map_err(|why| Denial::Refused(why.clone()))?;
                let rel = if host.is_absolute() {
                    let inside = [root.real.as_path(), root.given.as_path()]
                        .into_iter()
                        .find_map(|base| host.strip_prefix(base).ok());
                    match inside {
                        Some(rel) => rel.to_path_buf(),
                        None => {
                            return Err(Denial::Refused(std::format!(
                                "{} is outside the sandbox {}",
                                shown(path),
                                shown(root.real.as_os_str().as_bytes())
                            )))
                        }
                    }
                } else {
                    host.to_path_buf()
                };
                let absolute = root.real.join(&rel);
                (Place::Beneath { root, rel }, Some(absolute))
            }
        };
        if let Some(absolute) = absolute {
            let lexical = normalize(&absolute);
            let null = opening && lexical == Path::new("/dev/null");
            if never(&lexical) && !null {
                return Err(refused(
                    path,
                    "in /proc, /sys or /dev, which are never opened",
                ));
            }
        }
        Ok(place)
    }

    /// Opens the whole path with `flags` (never `O_CREAT`).
    fn open(&self, resolver: Resolver, flags: c_int) -> Outcome<OwnedFd> {
        match self {
            Place::Host(path) => openat(cwd(), &c_path(path), flags).map_err(Denial::Failed),
            Place::Beneath { root, rel } => beneath(root, rel, flags, resolver),
        }
    }

    /// The directory the last component is in (checked as a place the server may touch), and
    /// that component, which must be a plain name.
    fn parent(&self, resolver: Resolver) -> Outcome<(OwnedFd, CString)> {
        let path = match self {
            Place::Host(path) => *path,
            Place::Beneath { rel, .. } => rel.as_path(),
        };
        let shown_path = || shown(path.as_os_str().as_bytes());
        let (dir, name) = match (path.parent(), path.file_name()) {
            (Some(dir), Some(name)) => (dir, name),
            _ => {
                return Err(Denial::Refused(std::format!(
                    "{} does not name a file in a directory",
                    shown_path()
                )))
            }
        };
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
        let dir = match self {
            Place::Host(_) => {
                let dir = if dir.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    dir
                };
                openat(cwd(), &c_path(dir), flags).map_err(Denial::Failed)?
            }
            Place::Beneath { root, .. } => beneath(root, dir, flags, resolver)?,
        };
        check_place(dir.as_fd(), None).map_err(|why| {
            Denial::Refused(std::format!("the directory of {}: {why}", shown_path()))
        })?;
        Ok((dir, c_path(Path::new(name))))
    }
}

impl Root {
    /// Opens the sandbox's directory (following symbolic links in `dir`, which the embedder
    /// chose), and notes its real path: the directory the descriptor holds, whatever happens
    /// to its name later.
    fn open(dir: &Path) -> core::result::Result<Root, String> {
        let unusable = |error: io::Error| {
            std::format!(
                "the sandbox directory {} cannot be opened: {error}",
                shown(dir.as_os_str().as_bytes())
            )
        };
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
        let fd = openat(cwd(), &c_path(dir), flags).map_err(unusable)?;
        let real = std::fs::read_link(std::format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .or_else(|_| dir.canonicalize())
            .map_err(unusable)?;
        Ok(Root {
            given: dir.to_path_buf(),
            real,
            fd,
        })
    }
}

/// `rel` opened beneath the sandbox's directory.
fn beneath(root: &Root, rel: &Path, flags: c_int, resolver: Resolver) -> Outcome<OwnedFd> {
    if resolver == Resolver::Walk {
        return walk(root.fd.as_fd(), rel, flags);
    }
    let rel_c = if rel.as_os_str().is_empty() {
        c".".into()
    } else {
        c_path(rel)
    };
    match openat2(root.fd.as_fd(), &rel_c, flags) {
        Ok(fd) => Ok(fd),
        Err(error) if openat2_unavailable(&error) => walk(root.fd.as_fd(), rel, flags),
        Err(error) if error.raw_os_error() == Some(libc::EXDEV) => {
            Err(Denial::Refused(std::format!(
                "{} leads outside the sandbox",
                shown(rel.as_os_str().as_bytes())
            )))
        }
        Err(error) => Err(Denial::Failed(error)),
    }
}

/// Whether `openat2` failed because it cannot be used here (not because of the path).
fn openat2_unavailable(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOSYS | libc::EPERM | libc::E2BIG)
    )
}

/// `openat2(dir, rel, {flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS})`, retried on
/// `EAGAIN` (a rename raced the resolution) a few times.
fn openat2(dir: BorrowedFd<'_>, rel: &CStr, flags: c_int) -> io::Result<OwnedFd> {
    // SAFETY: `open_how` is three integers, for which all zeros is a valid value (and the
    // kernel's "nothing asked").
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = u64::from(flags as u32);
    // The kernel refuses a mode without O_CREAT.
    how.mode = if flags & libc::O_CREAT != 0 { 0o666 } else { 0 };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    let mut tries = 0;
    loop {
        // SAFETY: `dir` is an open descriptor, `rel` a NUL-terminated string and `how` an
        // `open_how` of the size passed, all live for the call.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                rel.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel just returned this descriptor, owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        let error = io::Error::last_os_error();
        tries += 1;
        if error.raw_os_error() != Some(libc::EAGAIN) || tries == 4 {
            return Err(error);
        }
    }
}

/// [`Resolver::Walk`]: each directory component of `rel` opened from the last with
/// `O_PATH | O_DIRECTORY | O_NOFOLLOW`, the last component with `flags | O_NOFOLLOW`; `.`
/// skipped, `..` and symbolic links refused. An empty `rel` is the directory itself.
fn walk(root: BorrowedFd<'_>, rel: &Path, flags: c_int) -> Outcome<OwnedFd> {
    let mut names = Vec::new();
    for component in rel.components() {
        match component {
            Component::Normal(name) => names.push(name),
            Component::CurDir => {}
            _ => {
                return Err(Denial::Refused(std::format!(
                    "{}: `..` is not followed in the sandbox",
                    shown(rel.as_os_str().as_bytes())
                )))
            }
        }
    }
    let link = |dir: BorrowedFd<'_>, name: &CStr, error: io::Error| {
        if matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))
            && stat_at(dir, name).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
        {
            Denial::Refused(std::format!(
                "{}: symbolic links are not followed in the sandbox without openat2",
                shown(rel.as_os_str().as_bytes())
            ))
        } else {
            Denial::Failed(error)
        }
    };
    let Some((last, dirs)) = names.split_last() else {
        return openat(root, c".", flags).map_err(Denial::Failed);
    };
    let mut here: Option<OwnedFd> = None;
    for name in dirs {
        let dir = here.as_ref().map_or(root, AsFd::as_fd);
        let name = c_path(Path::new(name));
        let step = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let next = openat(dir, &name, step).map_err(|error| link(dir, &name, error))?;
        here = Some(next);
    }
    let dir = here.as_ref().map_or(root, AsFd::as_fd);
    let name = c_path(Path::new(last));
    openat(dir, &name, flags | libc::O_NOFOLLOW).map_err(|error| link(dir, &name, error))
}

/// Why an open descriptor must not be handed to the device, if it must not: not a regular file
/// (nor `/dev/null`), a protected file, or a never-list place. Else its `fstat`.
fn check_file(
    fd: BorrowedFd<'_>,
    protected: &[FileId],
) -> core::result::Result<libc::stat, String> {
    let st = fstat(fd).map_err(|e| std::format!("cannot be checked: {e}"))?;
    let null = is_dev_null(&st);
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => {}
        libc::S_IFCHR if null => {}
        libc::S_IFDIR => return Err("a directory".into()),
        libc::S_IFIFO => return Err("a FIFO".into()),
        libc::S_IFSOCK => return Err("a socket".into()),
        libc::S_IFCHR | libc::S_IFBLK => return Err("a device".into()),
        _ => return Err("not a regular file".into()),
    }
    if protected.contains(&file_id(&st)) {
        return Err("a file the server protects (a mailbox, its log or its output)".into());
    }
    check_place(fd, Some(&st))?;
    Ok(st)
}

/// Why an open file or directory lies where the server never goes (`/proc`, `/sys`, `/dev` but
/// `/dev/null`, the kernel's pseudo file systems), if it does. `st`: the file's `fstat`
/// (`None` for a directory, which is fetched here).
fn check_place(fd: BorrowedFd<'_>, st: Option<&libc::stat>) -> core::result::Result<(), String> {
    let st = match st {
        Some(st) => *st,
        None => fstat(fd).map_err(|e| std::format!("cannot be checked: {e}"))?,
    };
    let null = is_dev_null(&st);
    // SAFETY: `statfs` is plain integers; all zeros is a valid value, overwritten below.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor and `fs` a writable `statfs`.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut fs) } != 0 {
        return Err(std::format!(
            "cannot be checked: {}",
            io::Error::last_os_error()
        ));
    }
    // `f_type`'s integer type differs between targets; the magic numbers are 32 bits.
    if let Some(name) = pseudo_fs(fs.f_type as u32) {
        return Err(std::format!("on {name}, which is never opened"));
    }
    if !null && on_dev_fs(&st) {
        return Err("in /dev, which is never opened".into());
    }
    if let Ok(real) = std::fs::read_link(std::format!("/proc/self/fd/{}", fd.as_raw_fd())) {
        if never(&real) && !(null && real == Path::new("/dev/null")) {
            return Err(std::format!(
                "{} is in /proc, /sys or /dev, which are never opened",
                shown(real.as_os_str().as_bytes())
            ));
        }
    }
    Ok(())
}

/// The name of a kernel pseudo file system, by its `f_type` magic number (a 32-bit value,
/// `linux/magic.h`).
fn pseudo_fs(magic: u32) -> Option<&'static str> {
    // The rest by value: not every libc target names them. Beyond the ones bound to /proc,
    // /sys and /dev, those that reach the kernel or the firmware wherever they are mounted.
    let known: [(u32, &str); 17] = [
        (libc::PROC_SUPER_MAGIC as u32, "procfs"),
        (libc::SYSFS_MAGIC as u32, "sysfs"),
        (libc::DEBUGFS_MAGIC as u32, "debugfs"),
        (libc::TRACEFS_MAGIC as u32, "tracefs"),
        (libc::SECURITYFS_MAGIC as u32, "securityfs"),
        (0x0027_e0eb, "cgroup"),
        (0x6367_7270, "cgroup2"),
        (0xcafe_4a11, "bpf"),
        (0x1cd1, "devpts"),
        (0xde5e_81e4, "efivarfs"),
        (0x6265_6570, "configfs"),
        (0x6165_676c, "pstore"),
        (0xf97c_ff8c, "selinuxfs"),
        (0x4341_5d53, "smackfs"),
        (0x6573_5543, "fusectl"),
        (0x6c6f_6f70, "binderfs"),
        (0x6e73_6673, "nsfs"),
    ];
    known
        .into_iter()
        .find(|&(m, _)| m == magic)
        .map(|(_, name)| name)
}

/// Whether a file is on the file system mounted at `/dev` (where `/dev` is a mount of its own:
/// else every file on the root file system would match).
fn on_dev_fs(st: &libc::stat) -> bool {
    match (stat_path(c"/dev"), stat_path(c"/")) {
        (Ok(dev), Ok(root)) => dev.st_dev != root.st_dev && st.st_dev == dev.st_dev,
        _ => false,
    }
}

/// Why `name` in `dir` must not be removed or renamed, if it must not: it is a protected file.
fn not_protected(
    dir: BorrowedFd<'_>,
    name: &CStr,
    protected: &[FileId],
) -> core::result::Result<(), String> {
    match stat_at(dir, name) {
        Ok(st) if protected.contains(&file_id(&st)) => {
            Err("a file the server protects (a mailbox, its log or its output)".into())
        }
        // Missing: the call itself fails, an ordinary C result.
        _ => Ok(()),
    }
}

/// Whether a path, as written, is in `/proc`, `/sys` or `/dev`.
fn never(path: &Path) -> bool {
    ["/proc", "/sys", "/dev"]
        .iter()
        .any(|top| path.starts_with(top))
}

/// `path` with `.` dropped and `..` applied to the components before it, without looking at
/// the file system (a first, lexical check only: the checks on the descriptor are the guard).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Whether the file is mapped into this process (`/proc/self/maps`): the program, a library,
/// a mailbox in a file. Writing it would change memory the host runs or serves from, so it is
/// never opened for writing. Without `/proc` this cannot be told (false).
fn mapped_here(st: &libc::stat) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    // Each line: address perms offset major:minor inode [path]; numbers of the device in hex.
    maps.lines().any(|line| {
        let mut fields = line.split_whitespace().skip(3);
        let (Some(device), Some(inode)) = (fields.next(), fields.next()) else {
            return false;
        };
        let Some((major, minor)) = device.split_once(':') else {
            return false;
        };
        match (
            u32::from_str_radix(major, 16),
            u32::from_str_radix(minor, 16),
            inode.parse::<u64>(),
        ) {
            (Ok(major), Ok(minor), Ok(inode)) => {
                inode != 0 && inode == st.st_ino && libc::makedev(major, minor) == st.st_dev
            }
            _ => false,
        }
    })
}

fn is_dev_null(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == libc::makedev(1, 3)
}

fn file_id(st: &libc::stat) -> FileId {
    (st.st_dev, st.st_ino)
}

/// The identity of the file at `path` (following symbolic links), for
/// [`super::Services::protect_file`].
pub(crate) fn identify(path: &Path) -> io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path)?;
    Ok((metadata.dev(), metadata.ino()))
}

fn cwd() -> BorrowedFd<'static> {
    // SAFETY: AT_FDCWD is a value every *at call accepts in place of a descriptor; it is never
    // closed.
    unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) }
}

/// A path as a C string (device paths are cut at their first NUL, so there is none inside).
fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap_or_default()
}

/// A device path for a log line: quoted and escaped, so it cannot forge lines, and cut, so a
/// long one makes a short line.
fn shown(path: &[u8]) -> String {
    crate::server::limits::quoted(path)
}

fn refused(path: &[u8], why: impl core::fmt::Display) -> Denial {
    Denial::Refused(std::format!("{}: {why}", shown(path)))
}

fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: c_int) -> io::Result<OwnedFd> {
    let mode: libc::c_uint = 0o666;
    // SAFETY: `dir` is an open descriptor (or AT_FDCWD) and `name` a NUL-terminated string,
    // both live for the call; the mode is read only with O_CREAT.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: `stat` is plain integers; all zeros is a valid value, overwritten by the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor and `st` a writable `stat`.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: as in `fstat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is an open descriptor, `name` a NUL-terminated string, `st` writable.
    let done = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn stat_path(path: &CStr) -> io::Result<libc::stat> {
    stat_at(cwd(), path)
}

/// Clears `O_NONBLOCK` (set only so that opening a FIFO could not block).
fn set_blocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: `fd` is an open descriptor; F_GETFL and F_SETFL take no pointers.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

impl super::Services {
    /// The rules a file request runs under: the policy and the protected files, now.
    pub(crate) fn file_rules(&self) -> Rules {
        Rules {
            access: lock(&self.file_access).clone(),
            protected: lock(&self.protected).clone(),
            resolver: Resolver::Openat2,
        }
    }

    /// OPEN_FILE's open under the file policy: the C stream, or why there is none.
    pub(crate) fn open_under_policy(
        &self,
        path: &CStr,
        mode: &CStr,
    ) -> core::result::Result<CFile, OpenError> {
        let rules = self.file_rules();
        let failed = |error: &dyn core::fmt::Display| {
            log::debug!("OPEN_FILE {}: {error}", shown(path.to_bytes()));
            OpenError::Failed
        };
        match open(&rules, path.to_bytes(), mode.to_bytes()) {
            Ok(fd) => CFile::from_fd(fd, mode).ok_or_else(|| failed(&io::Error::last_os_error())),
            Err(Denial::Refused(why)) => Err(OpenError::Refused(why)),
            Err(Denial::Failed(error)) => Err(failed(&error)),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A fresh directory under the temp dir, removed afterwards.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let path =
                std::env::temp_dir().join(std::format!("rpc-files-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            Dir(path)
        }
        fn join(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const RESOLVERS: [Resolver; 2] = [Resolver::Openat2, Resolver::Walk];

    fn rules(policy: FilePolicy, resolver: Resolver) -> Rules {
        Rules {
            access: Access::of(&policy),
            protected: Vec::new(),
            resolver,
        }
    }

    fn bytes(path: &Path) -> &[u8] {
        path.as_os_str().as_bytes()
    }

    fn refusal<T: core::fmt::Debug>(outcome: Outcome<T>) -> String {
        match outcome {
            Err(Denial::Refused(why)) => why,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn read(fd: OwnedFd) -> String {
        let mut text = String::new();
        std::fs::File::from(fd).read_to_string(&mut text).unwrap();
        text
    }

    fn mkfifo(path: &Path) {
        let c = c_path(path);
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn c_modes_become_open_flags_without_o_trunc() {
        let base = libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
        for (mode, flags) in [
            (&b"r"[..], libc::O_RDONLY),
            (b"rb", libc::O_RDONLY),
            (b"r+", libc::O_RDWR),
            (b"w", libc::O_WRONLY | libc::O_CREAT),
            (b"wx", libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL),
            (b"w+b", libc::O_RDWR | libc::O_CREAT),
            (b"a", libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND),
            (b"a+e", libc::O_RDWR | libc::O_CREAT | libc::O_APPEND),
        ] {
            assert_eq!(open_flags(mode), flags | base, "{mode:?}");
            assert_eq!(open_flags(mode) & libc::O_TRUNC, 0);
        }
    }

    #[test]
    fn openat2_falls_back_only_where_it_cannot_be_used() {
        for errno in [libc::ENOSYS, libc::EPERM, libc::E2BIG] {
            assert!(openat2_unavailable(&io::Error::from_raw_os_error(errno)));
        }
        for errno in [libc::EXDEV, libc::ENOENT, libc::ELOOP, libc::EACCES] {
            assert!(!openat2_unavailable(&io::Error::from_raw_os_error(errno)));
        }
    }

    /// Where the kernel has `openat2` (Linux 5.6, no seccomp filter against it), it is what
    /// refuses an escape; elsewhere the sandbox runs on the walk, tested on its own below.
    #[test]
    fn openat2_itself_refuses_escapes_where_the_kernel_has_it() {
        let dir = Dir::new("openat2");
        std::fs::write(dir.join("a"), "a").unwrap();
        let root = Root::open(&dir.0).unwrap();
        match openat2(root.fd.as_fd(), c"a", libc::O_RDONLY | libc::O_CLOEXEC) {
            Err(error) if openat2_unavailable(&error) => {
                std::eprintln!("openat2 is not available here ({error}): the walk is used");
            }
            Err(error) => panic!("openat2: {error}"),
            Ok(fd) => {
                assert_eq!(read(fd), "a");
                let escape = openat2(root.fd.as_fd(), c"../a", libc::O_RDONLY).unwrap_err();
                assert_eq!(escape.raw_os_error(), Some(libc::EXDEV));
                let absolute = openat2(root.fd.as_fd(), c"/etc/passwd", libc::O_RDONLY);
                assert_eq!(absolute.unwrap_err().raw_os_error(), Some(libc::EXDEV));
            }
        }
    }

    /// Every way out of the sandbox is refused, under both resolvers; paths inside work, with
    /// real reads and writes, relative or absolute.
    #[test]
    fn the_sandbox_holds_under_both_resolvers() {
        for resolver in RESOLVERS {
            let top = Dir::new(&std::format!("sandbox-{resolver:?}"));
            let jail = top.join("jail");
            std::fs::create_dir_all(jail.join("sub")).unwrap();
            std::fs::write(top.join("outside.txt"), "secret").unwrap();
            std::fs::write(jail.join("inside.txt"), "ok").unwrap();
            std::os::unix::fs::symlink(top.join("outside.txt"), jail.join("abs-link")).unwrap();
            std::os::unix::fs::symlink("../outside.txt", jail.join("rel-link")).unwrap();
            std::os::unix::fs::symlink("/etc", jail.join("etc")).unwrap();
            let rules = rules(FilePolicy::Sandbox(jail.clone()), resolver);
            let outside_abs = top.join("outside.txt");
            for (path, mode) in [
                (&b"/etc/passwd"[..], &b"r"[..]),
                (b"../outside.txt", b"r"),
                (b"../outside.txt", b"w"),
                (bytes(&outside_abs), b"r+"),
                (b"abs-link", b"w"),
                (b"rel-link", b"a"),
                (b"etc/passwd", b"r"),
                (b"sub/../../outside.txt", b"w"),
                (b"sub/../../jail/inside.txt", b"r"),
                (b"../jail/new.txt", b"w"),
            ] {
                let why = refusal(open(&rules, path, mode));
                assert!(!why.is_empty(), "{resolver:?} {path:?}");
            }
            assert_eq!(
                std::fs::read_to_string(&outside_abs).unwrap(),
                "secret",
                "{resolver:?}: nothing outside was truncated or written"
            );
            assert!(!top.join("new.txt").exists());

            // Inside: relative and absolute, existing and new, in a subdirectory.
            assert_eq!(read(open(&rules, b"inside.txt", b"r").unwrap()), "ok");
            let absolute = jail.join("inside.txt");
            assert_eq!(read(open(&rules, bytes(&absolute), b"r").unwrap()), "ok");
            for name in ["new.txt", "sub/deeper.txt"] {
                let mut file = std::fs::File::from(open(&rules, name.as_bytes(), b"w").unwrap());
                file.write_all(b"written").unwrap();
                drop(file);
                assert_eq!(std::fs::read_to_string(jail.join(name)).unwrap(), "written");
                let mut file = std::fs::File::from(open(&rules, name.as_bytes(), b"w+").unwrap());
                file.write_all(b"again").unwrap();
                drop(file);
                assert_eq!(
                    std::fs::read_to_string(jail.join(name)).unwrap(),
                    "again",
                    "w truncates a file that passed the checks"
                );
            }
            // `x` creates or fails, as C does.
            assert!(matches!(
                open(&rules, b"new.txt", b"wx"),
                Err(Denial::Failed(_))
            ));
            // A missing file to read is an ordinary failure, not a refusal.
            assert!(matches!(
                open(&rules, b"absent", b"r"),
                Err(Denial::Failed(_))
            ));
            // The kernel's resolution lets `..` that stays inside pass; the walk refuses it.
            let within = open(&rules, b"sub/../inside.txt", b"r");
            match resolver {
                Resolver::Openat2 => assert_eq!(read(within.unwrap()), "ok"),
                Resolver::Walk => drop(refusal(within)),
            }

            // REMOVE and RENAME: outside refused, inside done.
            refusal(remove(&rules, b"../outside.txt"));
            refusal(remove(&rules, bytes(&outside_abs)));
            refusal(remove(&rules, b"sub/../../outside.txt"));
            refusal(rename(&rules, b"new.txt", b"../stolen.txt"));
            refusal(rename(&rules, bytes(&outside_abs), b"mine.txt"));
            refusal(rename(&rules, b"new.txt", bytes(&outside_abs)));
            assert!(outside_abs.exists() && !top.join("stolen.txt").exists());
            rename(&rules, b"new.txt", b"sub/moved.txt").unwrap();
            assert_eq!(
                std::fs::read_to_string(jail.join("sub/moved.txt")).unwrap(),
                "again"
            );
            let moved = jail.join("sub/moved.txt");
            remove(&rules, bytes(&moved)).unwrap();
            remove(&rules, b"sub/deeper.txt").unwrap();
            // An empty directory goes too, as C `remove` does.
            remove(&rules, b"sub").unwrap();
            assert!(!jail.join("sub").exists());
            // Removing the link removes the link, not its target.
            remove(&rules, b"abs-link").unwrap();
            assert!(outside_abs.exists());
            assert!(matches!(remove(&rules, b"absent"), Err(Denial::Failed(_))));
            // The sandbox itself is no file in a directory.
            refusal(remove(&rules, bytes(&jail)));
            assert!(jail.exists());
        }
    }

    /// The rules hold the sandbox's directory by its descriptor: renamed, with a link to another
    /// directory in its place, it is still where paths resolve, under both resolvers.
    #[test]
    fn the_sandbox_follows_its_directory_not_its_name() {
        for resolver in RESOLVERS {
            let top = Dir::new(&std::format!("renamed-{resolver:?}"));
            let (jail, moved, elsewhere) = (top.join("jail"), top.join("moved"), top.join("out"));
            std::fs::create_dir_all(jail.join("sub")).unwrap();
            std::fs::create_dir_all(elsewhere.join("sub")).unwrap();
            std::fs::write(jail.join("sub/in.txt"), "ok").unwrap();
            std::fs::write(elsewhere.join("sub/in.txt"), "secret").unwrap();
            std::fs::write(elsewhere.join("victim.txt"), "secret").unwrap();
            let rules = rules(FilePolicy::Sandbox(jail.clone()), resolver);
            std::fs::rename(&jail, &moved).unwrap();
            std::os::unix::fs::symlink(&elsewhere, &jail).unwrap();

            assert_eq!(read(open(&rules, b"sub/in.txt", b"r").unwrap()), "ok");
            let absolute = jail.join("sub/in.txt");
            assert_eq!(read(open(&rules, bytes(&absolute), b"r").unwrap()), "ok");
            drop(open(&rules, b"sub/new.txt", b"w").unwrap());
            assert!(moved.join("sub/new.txt").exists());
            rename(&rules, b"sub/new.txt", b"moved.txt").unwrap();
            assert!(moved.join("moved.txt").exists());
            assert!(matches!(
                remove(&rules, b"victim.txt"),
                Err(Denial::Failed(_))
            ));
            assert_eq!(
                std::fs::read_to_string(elsewhere.join("victim.txt")).unwrap(),
                "secret"
            );
            assert_eq!(
                std::fs::read_to_string(elsewhere.join("sub/in.txt")).unwrap(),
                "secret"
            );
            assert!(
                !elsewhere.join("sub/new.txt").exists() && !elsewhere.join("moved.txt").exists()
            );
        }
    }

    /// What is never opened, under Allow (the most open policy) and in a sandbox.
    #[test]
    fn proc_sys_dev_and_special_files_are_never_opened() {
        let dir = Dir::new("never");
        let allow = rules(FilePolicy::Allow, Resolver::Openat2);
        for (path, mode) in [
            ("/proc/self/mem", "r+"),
            ("/proc/self/maps", "r"),
            ("/proc/self/fd/0", "r"),
            ("/proc/../proc/self/mem", "r"),
            ("/sys/kernel/notes", "r"),
            ("/dev/zero", "r"),
            ("/dev/../dev/zero", "r"),
            ("/dev/rpc-never-created", "w"),
        ] {
            let why = refusal(open(&allow, path.as_bytes(), mode.as_bytes()));
            assert!(why.contains("never"), "{path}: {why}");
        }
        assert!(!Path::new("/dev/rpc-never-created").exists());
        // Behind symbolic links the path as written looks harmless: the descriptor's own
        // file system, type and real path are what refuse it.
        let targets = [
            ("/proc/self/mem", "procfs"),
            ("/proc/self/status", "procfs"),
            ("/dev/zero", "a device"),
            ("/dev", "a directory"),
            ("/sys/kernel", "a directory"),
        ];
        for (k, (target, why)) in targets.iter().enumerate() {
            if !Path::new(target).exists() {
                continue;
            }
            let link = dir.join(&std::format!("link{k}"));
            std::os::unix::fs::symlink(target, &link).unwrap();
            let refused = refusal(open(&allow, bytes(&link), b"r"));
            assert!(refused.contains(why), "{target}: {refused}");
        }
        // A regular file in a tmpfs under /dev (its real path gives it away).
        if Path::new("/dev/shm").is_dir() {
            let shm = PathBuf::from(std::format!("/dev/shm/rpc-files-{}", std::process::id()));
            std::fs::write(&shm, "kept").unwrap();
            let link = dir.join("shm-link");
            std::os::unix::fs::symlink(&shm, &link).unwrap();
            let refused = refusal(open(&allow, bytes(&link), b"w"));
            assert!(refused.contains("/dev/shm"), "{refused}");
            assert_eq!(
                std::fs::read_to_string(&shm).unwrap(),
                "kept",
                "not truncated"
            );
            refusal(remove(&allow, bytes(&shm)));
            std::fs::remove_file(&shm).unwrap();
        }
        // /dev/null opens, for reading and writing.
        let null = open(&allow, b"/dev/null", b"w").unwrap();
        std::fs::File::from(null).write_all(b"gone").unwrap();
        assert_eq!(read(open(&allow, b"/dev/null", b"r").unwrap()), "");
        // ... but is not removed or renamed.
        refusal(remove(&allow, b"/dev/null"));
        refusal(rename(&allow, b"/dev/null", bytes(&dir.join("null"))));
        // A FIFO nobody writes is refused at once (opening does not wait for a writer), in
        // every mode; a directory too.
        let fifo = dir.join("fifo");
        mkfifo(&fifo);
        for mode in ["r", "r+", "w", "a"] {
            let why = refusal(open(&allow, bytes(&fifo), mode.as_bytes()));
            assert!(
                why.contains("FIFO") || why.contains("never"),
                "{mode}: {why}"
            );
        }
        let why = refusal(open(&allow, bytes(&dir.0), b"r"));
        assert!(why.contains("directory"), "{why}");
        // A dangling link is not followed to create its target.
        let dangling = dir.join("dangling");
        std::os::unix::fs::symlink(dir.join("target"), &dangling).unwrap();
        refusal(open(&allow, bytes(&dangling), b"w"));
        assert!(!dir.join("target").exists());
        // The same in a sandbox, under both resolvers.
        for resolver in RESOLVERS {
            let sandbox = rules(FilePolicy::Sandbox(dir.0.clone()), resolver);
            refusal(open(&sandbox, b"fifo", b"r"));
            refusal(open(&sandbox, b".", b"r"));
            refusal(open(&sandbox, b"dangling", b"w"));
            assert!(!dir.join("target").exists());
        }
        // Removing the FIFO is fine (it is never opened).
        remove(&allow, bytes(&fifo)).unwrap();
    }

    /// A protected file is not opened (in any mode, under any name), removed or renamed, and a
    /// refused `w` leaves it whole.
    #[test]
    fn protected_files_stay_untouched() {
        let dir = Dir::new("protected");
        let mailbox = dir.join("mailbox");
        std::fs::write(&mailbox, "mailbox bytes").unwrap();
        std::fs::hard_link(&mailbox, dir.join("alias")).unwrap();
        std::os::unix::fs::symlink(&mailbox, dir.join("link")).unwrap();
        std::fs::write(dir.join("other"), "other").unwrap();
        let id = identify(&mailbox).unwrap();
        let policies = [
            (FilePolicy::Allow, Resolver::Openat2),
            (FilePolicy::Sandbox(dir.0.clone()), Resolver::Openat2),
            (FilePolicy::Sandbox(dir.0.clone()), Resolver::Walk),
        ];
        for (policy, resolver) in policies {
            let rules = Rules {
                protected: std::vec![id],
                ..rules(policy, resolver)
            };
            for name in ["mailbox", "alias"] {
                let path = dir.join(name);
                for mode in ["r", "r+", "w", "a"] {
                    let why = refusal(open(&rules, bytes(&path), mode.as_bytes()));
                    assert!(why.contains("protects"), "{name} {mode}: {why}");
                }
                refusal(remove(&rules, bytes(&path)));
                refusal(rename(&rules, bytes(&path), bytes(&dir.join("moved"))));
                refusal(rename(&rules, bytes(&dir.join("other")), bytes(&path)));
            }
            if let Access::Allow = rules.access {
                refusal(open(&rules, bytes(&dir.join("link")), b"w"));
            }
            assert_eq!(std::fs::read_to_string(&mailbox).unwrap(), "mailbox bytes");
            assert!(dir.join("other").exists() && !dir.join("moved").exists());
        }
    }

    /// A file this process has mapped (as rpc-serve maps a mailbox file) opens for reading,
    /// never for writing (under Allow, where nothing else stops it); once unmapped it does.
    #[test]
    fn files_mapped_into_the_process_are_never_opened_for_writing() {
        let dir = Dir::new("mapped");
        let path = dir.join("mapped");
        std::fs::write(&path, [7u8; 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a fresh read-only shared mapping of a 4096-byte file, unmapped below; nothing
        // reads through it.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        let allow = rules(FilePolicy::Allow, Resolver::Openat2);
        assert!(open(&allow, bytes(&path), b"r").is_ok());
        for mode in [&b"w"[..], b"a", b"r+", b"a+"] {
            let why = refusal(open(&allow, bytes(&path), mode));
            assert!(why.contains("mapped into the server's process"), "{why}");
        }
        assert_eq!(std::fs::read(&path).unwrap(), [7u8; 4096], "not truncated");
        // SAFETY: the mapping made above, of 4096 bytes, unmapped once.
        assert_eq!(unsafe { libc::munmap(map, 4096) }, 0);
        assert!(open(&allow, bytes(&path), b"r+").is_ok());
    }

    #[test]
    fn deny_refuses_everything() {
        let dir = Dir::new("deny");
        std::fs::write(dir.join("a"), "a").unwrap();
        let deny = rules(FilePolicy::Deny, Resolver::Openat2);
        let a = dir.join("a");
        refusal(open(&deny, bytes(&a), b"r"));
        refusal(remove(&deny, bytes(&a)));
        refusal(rename(&deny, bytes(&a), bytes(&dir.join("b"))));
        assert!(a.exists());
    }

    #[test]
    fn a_sandbox_that_cannot_be_opened_refuses() {
        let rules = rules(
            FilePolicy::Sandbox(PathBuf::from("/nonexistent/rpc-sandbox")),
            Resolver::Openat2,
        );
        let why = refusal(open(&rules, b"x", b"w"));
        assert!(why.contains("sandbox directory"), "{why}");
    }
}
