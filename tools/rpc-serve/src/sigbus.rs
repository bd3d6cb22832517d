//! Surviving a mailbox file that another process truncates, the way Wayland compositors survive
//! a client shrinking its `wl_shm` pool.
//!
//! A `MAP_SHARED` mapping of a file whose pages were cut off by `ftruncate` raises `SIGBUS` at
//! the next access. rpc-serve's worker reads the mailbox on every pass, so a client could end it
//! whenever it liked. [`install`] puts a process-wide `SIGBUS` handler in place before serving;
//! [`guard`] names the one mapping it may repair. When a fault lies in that mapping, the handler
//! maps anonymous zero pages over the whole of it (`MAP_FIXED`, so the address range stays
//! mapped and every pointer into it stays valid) and sets a flag; the faulting access is then
//! retried by the CPU and succeeds on the zero pages, which the server reads as an idle mailbox.
//! The handler then wakes the main loop through the socket given to [`wake_on_fault`]; it sees
//! [`faulted`], detaches the mailbox and exits. A fault anywhere else is not
//! ours to mend: it goes to the handler installed before (std's, which tells a stack overflow
//! from other faults), or the default disposition is restored and the access faults again and
//! kills the process, as it would have without us.
//!
//! Written with `libc` by hand: `signal-hook` (used for SIGINT/SIGTERM) refuses SIGBUS, since
//! its handlers cannot return into the faulting access usefully, and no crate offers "replace
//! this mapping when it faults".
//!
//! # Memory ordering
//! The handler runs on whichever thread faulted, interrupting it anywhere, so it only loads
//! atomics (lock-free statics: std's, never loom's) and makes three system calls (`mmap`,
//! `sigaction`, `send`; `mmap` is not on POSIX's async-signal-safe list but is a bare system
//! call on Linux, which is what Wayland compositors rely on too).
//! - `BASE`/`LEN` describe the guarded mapping. [`guard`] stores `LEN` (relaxed), then `BASE`
//!   (release); the handler loads `BASE` (acquire) and then `LEN`, so a non-zero base comes with
//!   its length. The guard is taken before the mailbox is attached, so before any thread of ours
//!   can fault in it (the worker is told of the mailbox through the server's own locks, which
//!   order it after these stores too).
//! - [`Guard`]'s drop stores `BASE = 0` (release) before the mapping is unmapped: the server has
//!   detached the mailbox by then, so no thread of ours touches those addresses any more, and a
//!   later fault at the same addresses lies in a new mapping, made by an `mmap` that the kernel
//!   orders after our `munmap` (both take the address space's lock), hence after this store.
//! - `FAULTED` is a plain flag, stored (release) by the handler after its `mmap` and loaded
//!   (acquire) by the main loop: the main loop only reports and detaches, and the zero pages are
//!   the kernel's, visible to every thread once the `mmap` returned, so acquire/release only
//!   makes the order explicit. The handler stores it before it sends the wake-up byte, and the
//!   main loop reads it after each wake-up (and before it first blocks), so no fault is missed.
//! - `WAKE` (the socket's descriptor) is stored once by [`wake_on_fault`] before the mailbox is
//!   mapped, so before any fault of ours; relaxed, since a handler that saw no descriptor yet
//!   has nobody to wake.
//! - `PREVIOUS` (the action replaced) is written once by [`install`] before the handler is put in
//!   place, and read by the handler through `OnceLock::get`, one acquire load with no lock.

use std::ffi::c_void;
use std::os::fd::IntoRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The guarded mapping's first byte (0: none).
static BASE: AtomicUsize = AtomicUsize::new(0);
/// Its length in bytes.
static LEN: AtomicUsize = AtomicUsize::new(0);
/// Set once the handler has replaced the guarded mapping with zero pages.
static FAULTED: AtomicBool = AtomicBool::new(false);
/// The socket the handler writes a byte to once it has set `FAULTED` (-1: none).
static WAKE: AtomicI32 = AtomicI32::new(-1);

/// The `SIGBUS` action in place before [`install`] (std's stack-overflow handler, usually).
struct Previous(libc::sigaction);
// SAFETY: a `sigaction` is plain data (a handler address, a mask, flags); it is written once
// before any thread can read it and never changed.
unsafe impl Sync for Previous {}
// SAFETY: as above; moving it between threads moves plain data.
unsafe impl Send for Previous {}
static PREVIOUS: OnceLock<Previous> = OnceLock::new();

/// Installs the process-wide `SIGBUS` handler. Call once, before anything is mapped or served.
pub fn install() -> std::io::Result<()> {
    // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty mask, no flags), which
    // `sigaction` overwrites with the current action.
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current one into `previous`, a valid out pointer.
    if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Stored before the handler can run, so the handler always finds it.
    if PREVIOUS.set(Previous(previous)).is_err() {
        return Err(std::io::Error::other(
            "the SIGBUS handler is already installed",
        ));
    }
    // SAFETY: as above, an all-zero `sigaction` is valid; its fields are set below.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigbus as *const () as usize;
    // SA_SIGINFO: the handler needs `si_addr`. SA_ONSTACK: std gives its threads an alternate
    // signal stack for its stack-overflow report, which the chained handler needs to run on.
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: `sa_mask` is a valid `sigset_t` to empty: nothing more is blocked than SIGBUS
    // itself while the handler runs.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: `action` is fully initialised and names `on_sigbus`, which has the SA_SIGINFO
    // signature and lives as long as the process; the old-action pointer may be null.
    if unsafe { libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// While alive, a fault in `len` bytes from `base` is mended by the handler. Dropped before the
/// mapping is unmapped.
#[must_use = "the mapping is guarded only while the Guard lives"]
pub struct Guard(());

/// Guards the mapping of `len` bytes at `base` (one at a time: rpc-serve serves one mailbox).
///
/// # Safety
/// - `base` is page-aligned and `len` bytes from it are one mapping this process made and will
///   not unmap while the returned guard lives;
/// - nothing in it needs to survive a fault: the handler replaces all of it with zero pages,
///   which is only fit for memory read as garbage anyway (a mailbox another process writes).
pub unsafe fn guard(base: *mut u8, len: usize) -> Guard {
    assert!(
        len > 0 && BASE.load(Ordering::Relaxed) == 0,
        "one guarded mapping at a time"
    );
    // Ordered before BASE by the release below (see "Memory ordering").
    LEN.store(len, Ordering::Relaxed);
    // Release: a handler that acquires this base sees LEN.
    BASE.store(base as usize, Ordering::Release);
    Guard(())
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Release, before the munmap that follows this drop (see "Memory ordering").
        BASE.store(0, Ordering::Release);
    }
}

/// After a fault it mended, the handler writes a byte to `socket` (without blocking: a full
/// socket is already readable), so a thread blocked reading the other end wakes and sees
/// [`faulted`]. Call once, before the guarded mapping is made; the socket lives as long as the
/// process.
pub fn wake_on_fault(socket: UnixStream) {
    WAKE.store(socket.into_raw_fd(), Ordering::Relaxed);
}

/// True once the handler replaced the guarded mapping (its file was truncated).
pub fn faulted() -> bool {
    // Acquire: pairs with the handler's release store after its mmap.
    FAULTED.load(Ordering::Acquire)
}

/// The `SIGBUS` handler (SA_SIGINFO).
extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: errno is this thread's; reading it has no preconditions. It is restored before
    // returning, so the interrupted code never sees the handler's system calls' errno.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO handler; for SIGBUS,
    // `si_addr` is the faulting address.
    let (address, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    // Acquire: pairs with `guard`'s release, so LEN belongs to this base.
    let base = BASE.load(Ordering::Acquire);
    let len = LEN.load(Ordering::Relaxed);
    // BUS_ADRERR is "no page behind this address", what a truncated file gives; a hardware
    // memory error (BUS_MCEERR_*) is not ours to paper over.
    let ours = base != 0 && address.wrapping_sub(base) < len && code == libc::BUS_ADRERR;
    if ours {
        // SAFETY: `guard`'s contract: [base, base + len) is one mapping of ours that stays
        // mapped while guarded; MAP_FIXED replaces exactly that range with private zero pages,
        // so every pointer into it stays valid, and nothing else is touched.
        let mapped = unsafe {
            libc::mmap(
                base as *mut c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if mapped as usize == base {
            // Release: after the mmap (see "Memory ordering"). Another thread faulting at the
            // same time maps zero pages over the range again, which is as harmless.
            FAULTED.store(true, Ordering::Release);
            let wake = WAKE.load(Ordering::Relaxed);
            if wake >= 0 {
                // SAFETY: `wake` is a socket `wake_on_fault` took for the whole process; one
                // byte from a static; `send` is async-signal-safe, and MSG_DONTWAIT keeps it
                // from blocking (a full socket already wakes its reader).
                unsafe { libc::send(wake, b"B".as_ptr().cast(), 1, libc::MSG_DONTWAIT) };
            }
            // SAFETY: as above, this thread's errno.
            unsafe { *libc::__errno_location() = errno };
            // Returning retries the faulting access, now on zero pages.
            return;
        }
        // The mmap failed: fall through, and the fault is fatal as it would have been.
    }
    // SAFETY: the arguments are the kernel's, passed on unchanged.
    unsafe { chain(signal, info, context) };
    // SAFETY: as above, this thread's errno.
    unsafe { *libc::__errno_location() = errno };
}

/// Hands a fault that is not ours to the action in place before [`install`], or restores the
/// default disposition, so that returning re-executes the access and the kernel kills the
/// process as it would have without this handler.
///
/// # Safety
/// Called only from the SIGBUS handler, with the kernel's arguments.
unsafe fn chain(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let previous = PREVIOUS.get().map(|p| p.0);
    match previous {
        Some(previous)
            if previous.sa_sigaction != libc::SIG_DFL && previous.sa_sigaction != libc::SIG_IGN =>
        {
            if previous.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: with SA_SIGINFO set, the handler address is a three-argument
                // handler, installed by whoever ran before us and never unloaded.
                let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                    unsafe { std::mem::transmute(previous.sa_sigaction) };
                handler(signal, info, context);
            } else {
                // SAFETY: without SA_SIGINFO, it is a one-argument handler.
                let handler: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(previous.sa_sigaction) };
                handler(signal);
            }
        }
        // SIG_DFL, or SIG_IGN (which a synchronous SIGBUS cannot honour anyway).
        _ => {
            // SAFETY: an all-zero `sigaction` is SIG_DFL with an empty mask and no flags.
            let default: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: a valid action; sigaction is async-signal-safe.
            unsafe { libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::Command;

    /// Set in the child that `helper_truncate_and_read` runs in: `guarded` or `unguarded`.
    const CHILD_ENV: &str = "RPC_SERVE_SIGBUS_CHILD";
    const FILE_ENV: &str = "RPC_SERVE_SIGBUS_FILE";

    /// Not a test of its own: in a child run by the tests below, installs the handler, maps a
    /// file (guarded or not), truncates it and reads the mapping.
    #[test]
    fn helper_truncate_and_read() {
        let (Ok(which), Ok(path)) = (std::env::var(CHILD_ENV), std::env::var(FILE_ENV)) else {
            return;
        };
        super::install().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(8192).unwrap();
        // SAFETY: the file is this process's own; the mapping is read below only while `map`
        // lives, with volatile reads (the handler may replace its pages).
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.unwrap();
        let _guard = (which == "guarded")
            // SAFETY: `map` is one page-aligned mapping that outlives the guard (declared after
            // it, so dropped before it); its contents do not matter.
            .then(|| unsafe { super::guard(map.as_ptr() as *mut u8, map.len()) });
        file.set_len(0).unwrap();
        // SAFETY: in bounds of the mapping; a volatile read, since the pages may change under it.
        let byte = unsafe { std::ptr::read_volatile(map.as_ptr().add(4096)) };
        println!("survived: byte={byte} faulted={}", super::faulted());
    }

    /// No core file from a child that is meant to die.
    fn no_core_file() -> std::io::Result<()> {
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Runs `helper_truncate_and_read` in a child process, `which` way.
    fn run(which: &str, tag: &str) -> std::process::Output {
        let path =
            std::env::temp_dir().join(format!("rpc-serve-sigbus-{}-{tag}", std::process::id()));
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(["--exact", "sigbus::tests::helper_truncate_and_read"])
            .args(["--nocapture", "--test-threads", "1"])
            .env(CHILD_ENV, which)
            .env(FILE_ENV, &path);
        // SAFETY: `no_core_file` only calls setrlimit, which is async-signal-safe.
        unsafe { command.pre_exec(no_core_file) };
        let output = command.output().unwrap();
        let _ = std::fs::remove_file(&path);
        output
    }

    #[test]
    fn a_fault_in_the_guarded_mapping_gets_zero_pages_and_sets_the_flag() {
        let output = run("guarded", "guarded");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{}: {stdout}", output.status);
        assert!(stdout.contains("survived: byte=0 faulted=true"), "{stdout}");
    }

    #[test]
    fn a_fault_outside_the_guarded_mapping_still_kills_with_sigbus() {
        let output = run("unguarded", "unguarded");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            output.status.signal(),
            Some(libc::SIGBUS),
            "{}: {stdout}",
            output.status
        );
        assert!(!stdout.contains("survived"), "{stdout}");
    }
}
