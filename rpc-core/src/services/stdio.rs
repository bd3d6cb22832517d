//! stdio and file opcodes (PROTOCOL section 6, numbers 2-9, 14-20, 27, 28). Scripts and
//! refusals are listed in the module documentation of [`super`].

use std::ffi::{c_int, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::string::String;
use std::vec::Vec;

use super::streams::{OpenError, Target};
use super::{
    active, c_result, recv_streams, recv_words, send_word0, until_nul, FilePolicy, LaneStream,
    Refusals, EOF_WORD,
};
use crate::registry::Request;
use crate::Result;

fn bound(req: &Request<'_, '_>) -> u64 {
    super::context(req).config.stream_bound
}

/// Writes each lane's stream to `target(lane)`; replies the bytes written.
fn write_lanes(
    req: &mut Request<'_, '_>,
    data: &[LaneStream],
    target: impl Fn(u32) -> Option<Target>,
    newline: bool,
    refusals: &mut Refusals,
) -> Result<()> {
    let services = &super::context(req).services;
    let mut replies = [0u64; 64];
    for lane in active(req) {
        let bytes = match &data[lane as usize] {
            Ok(bytes) => bytes,
            Err(len) => {
                refusals.too_long(lane, *len, bound(req));
                continue;
            }
        };
        let Some(target) = target(lane) else {
            refusals.lane(lane, "not a live stream handle");
            continue;
        };
        replies[lane as usize] = if newline {
            let mut line = Vec::with_capacity(bytes.len() + 1);
            line.extend_from_slice(bytes);
            line.push(b'\n');
            services.write(&target, &line) as u64
        } else {
            services.write(&target, bytes) as u64
        };
    }
    send_word0(req, &replies)
}

fn write_std(req: &mut Request<'_, '_>, target: fn() -> Target, newline: bool) -> Result<()> {
    let data = recv_streams(req)?;
    let mut refusals = Refusals::default();
    write_lanes(req, &data, |_| Some(target()), newline, &mut refusals)?;
    refusals.finish()
}

/// WRITE_TO_STDOUT: C send_n(bytes); S send buf\[0\] = written.
pub(crate) fn write_to_stdout(req: &mut Request<'_, '_>) -> Result<()> {
    write_std(req, || Target::Stdout, false)
}

/// WRITE_TO_STDERR: as WRITE_TO_STDOUT, to stderr.
pub(crate) fn write_to_stderr(req: &mut Request<'_, '_>) -> Result<()> {
    write_std(req, || Target::Stderr, false)
}

/// WRITE_TO_STDOUT_NEWLINE: as WRITE_TO_STDOUT, then `\n` (in the same write), counted.
pub(crate) fn write_to_stdout_newline(req: &mut Request<'_, '_>) -> Result<()> {
    write_std(req, || Target::Stdout, true)
}

/// WRITE_TO_STREAM: C send buf\[0\] = raw handle; C send_n(bytes); S send buf\[0\] = written.
pub(crate) fn write_to_stream(req: &mut Request<'_, '_>) -> Result<()> {
    let handles = recv_words(req)?;
    let data = recv_streams(req)?;
    let services = &super::context(req).services;
    let mut refusals = Refusals::default();
    write_lanes(
        req,
        &data,
        |lane| services.raw(handles[lane as usize][0]),
        false,
        &mut refusals,
    )?;
    refusals.finish()
}

/// READ_FROM_STREAM: C send {buf\[0\] = max, buf\[1\] = tagged}; S send_n(data);
/// S send buf\[0\] = bytes read. The max is bounded by the stream bound.
pub(crate) fn read_from_stream(req: &mut Request<'_, '_>) -> Result<()> {
    let words = recv_words(req)?;
    let services = &super::context(req).services;
    let bound = bound(req);
    let mut refusals = Refusals::default();
    let mut data: Vec<Vec<u8>> = (0..64).map(|_| Vec::new()).collect();
    for lane in active(req) {
        let [max, handle, ..] = words[lane as usize];
        match services.tagged(handle) {
            Some(target) => {
                let max = max.min(bound).min(usize::MAX as u64) as usize;
                data[lane as usize] = services.read(&target, max);
            }
            None => refusals.lane(lane, "not a live stream handle"),
        }
    }
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    req.send_n(&slices)?;
    let mut replies = [0u64; 64];
    for lane in active(req) {
        replies[lane as usize] = data[lane as usize].len() as u64;
    }
    send_word0(req, &replies)?;
    refusals.finish()
}

/// READ_FGETS: C send {buf\[0\] = count, buf\[1\] = tagged}; S send_n(line incl. NUL, or 0 bytes
/// at the end or on an error). The count is bounded by the stream bound.
pub(crate) fn read_fgets(req: &mut Request<'_, '_>) -> Result<()> {
    let words = recv_words(req)?;
    let services = &super::context(req).services;
    let bound = bound(req);
    let mut refusals = Refusals::default();
    let mut lines: Vec<Vec<u8>> = (0..64).map(|_| Vec::new()).collect();
    for lane in active(req) {
        let [count, handle, ..] = words[lane as usize];
        match services.tagged(handle) {
            Some(target) => {
                let count = count.min(bound).min(c_int::MAX as u64) as usize;
                lines[lane as usize] = services.gets(&target, count).unwrap_or_default();
            }
            None => refusals.lane(lane, "not a live stream handle"),
        }
    }
    let slices: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
    req.send_n(&slices)?;
    refusals.finish()
}

/// A device path as a host path and a C string (up to its first NUL).
fn device_path(bytes: &[u8]) -> (PathBuf, CString) {
    let bytes = until_nul(bytes);
    let path = Path::new(OsStr::from_bytes(bytes)).to_path_buf();
    // `until_nul` removed every NUL, so this cannot fail.
    let c = CString::new(bytes).unwrap_or_default();
    (path, c)
}

/// Whether the file policy lets a request touch `path`. `follow`: the operation follows a
/// symbolic link in the last component (opening does; removing and renaming do not).
fn permitted(policy: &FilePolicy, path: &Path, follow: bool) -> core::result::Result<(), String> {
    let root = match policy {
        FilePolicy::Allowed => return Ok(()),
        FilePolicy::Denied => return Err("file access is denied by the server's policy".into()),
        FilePolicy::Under(root) => root,
    };
    let outside = || {
        std::format!(
            "{} is outside {} (the server's file policy)",
            path.display(),
            root.display()
        )
    };
    let root = root.canonicalize().map_err(|e| {
        std::format!(
            "the policy's directory {} cannot be resolved: {e}",
            root.display()
        )
    })?;
    let exists = path.symlink_metadata().is_ok();
    let resolved = if follow && exists {
        // Also resolves a symbolic link at the end; a dangling one is refused (opening it for
        // writing would create its target, wherever that is).
        path.canonicalize().map_err(|_| outside())?
    } else {
        let name = path.file_name().ok_or_else(outside)?;
        let parent = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        parent.canonicalize().map_err(|_| outside())?.join(name)
    };
    if resolved.starts_with(&root) {
        Ok(())
    } else {
        Err(outside())
    }
}

/// A mode fopen may get: `r`, `w` or `a`, then only `+`, `b`, `x`, `e` (no glibc extensions
/// such as `,ccs=`), at most 8 bytes.
fn valid_mode(mode: &[u8]) -> bool {
    matches!(mode.first(), Some(b'r' | b'w' | b'a'))
        && mode.len() <= 8
        && mode[1..].iter().all(|b| b"+bxe".contains(b))
}

/// OPEN_FILE: C send_n(path incl. NUL); C send(mode incl. NUL in the buffer);
/// S send buf\[0\] = handle or 0.
pub(crate) fn open_file(req: &mut Request<'_, '_>) -> Result<()> {
    let paths = recv_streams(req)?;
    let mut modes = [[0u8; 64]; 64];
    req.recv(|lane, p| p.read_bytes(0, &mut modes[lane as usize]))?;
    let services = &super::context(req).services;
    let policy = services.config().files;
    let mut refusals = Refusals::default();
    let mut replies = [0u64; 64];
    for lane in active(req) {
        let path = match &paths[lane as usize] {
            Ok(path) => path,
            Err(len) => {
                refusals.too_long(lane, *len, bound(req));
                continue;
            }
        };
        let mode = until_nul(&modes[lane as usize]);
        if !valid_mode(mode) {
            refusals.lane(
                lane,
                std::format!("bad fopen mode {:?}", String::from_utf8_lossy(mode)),
            );
            continue;
        }
        let (host_path, c_path) = device_path(path);
        if let Err(why) = permitted(&policy, &host_path, true) {
            refusals.lane(lane, why);
            continue;
        }
        let c_mode = CString::new(mode).unwrap_or_default();
        match services.open(&c_path, &c_mode) {
            Ok(handle) => replies[lane as usize] = handle,
            // A failed fopen is an ordinary C result; only the table limit is a refusal.
            Err(OpenError::Failed) => log::debug!(
                "OPEN_FILE {}: {}",
                host_path.display(),
                std::io::Error::last_os_error()
            ),
            Err(OpenError::TooMany) => refusals.lane(lane, "too many open files"),
        }
    }
    send_word0(req, &replies)?;
    refusals.finish()
}

/// CLOSE_FILE: C send buf\[0\] = raw handle; S send buf\[0\] = 0 or EOF.
pub(crate) fn close_file(req: &mut Request<'_, '_>) -> Result<()> {
    let words = recv_words(req)?;
    let services = &super::context(req).services;
    let mut refusals = Refusals::default();
    let mut replies = [EOF_WORD; 64];
    for lane in active(req) {
        let handle = words[lane as usize][0];
        if (1..=3).contains(&handle) {
            refusals.lane(lane, "the standard streams cannot be closed");
            continue;
        }
        match services.close(handle) {
            Some(result) => replies[lane as usize] = c_result(result.into()),
            None => refusals.lane(lane, std::format!("{handle:#x} is not a live file handle")),
        }
    }
    send_word0(req, &replies)?;
    refusals.finish()
}

/// The pattern of FEOF, FERROR, FTELL, FFLUSH, UNGETC, FSEEK: C send {words}; S send buf\[0\]
/// = `op(target, words)`, or `bad` where buf\[`at`\] is not a live tagged handle.
fn on_stream(
    req: &mut Request<'_, '_>,
    at: usize,
    bad: u64,
    op: impl Fn(&super::Services, &Target, &[u64; 8]) -> u64,
) -> Result<()> {
    let words = recv_words(req)?;
    let services = &super::context(req).services;
    let mut refusals = Refusals::default();
    let mut replies = [bad; 64];
    for lane in active(req) {
        let words = &words[lane as usize];
        match services.tagged(words[at]) {
            Some(target) => replies[lane as usize] = op(services, &target, words),
            None => refusals.lane(
                lane,
                std::format!("{:#x} is not a live stream handle", words[at]),
            ),
        }
    }
    send_word0(req, &replies)?;
    refusals.finish()
}

/// FEOF: C send buf\[0\] = tagged; S send buf\[0\] = feof (1 for a bad handle).
pub(crate) fn feof(req: &mut Request<'_, '_>) -> Result<()> {
    on_stream(req, 0, 1, |s, t, _| c_result(s.eof(t).into()))
}

/// FERROR: C send buf\[0\] = tagged; S send buf\[0\] = ferror (1 for a bad handle).
pub(crate) fn ferror(req: &mut Request<'_, '_>) -> Result<()> {
    on_stream(req, 0, 1, |s, t, _| c_result(s.error(t).into()))
}

/// FTELL: C send buf\[0\] = tagged; S send buf\[0\] = ftell as i64 (-1 for a bad handle).
pub(crate) fn ftell(req: &mut Request<'_, '_>) -> Result<()> {
    on_stream(req, 0, c_result(-1), |s, t, _| c_result(s.tell(t)))
}

/// FSEEK: C send {tagged, offset, whence}; S send buf\[0\] = 0 or -1.
pub(crate) fn fseek(req: &mut Request<'_, '_>) -> Result<()> {
    on_stream(req, 0, c_result(-1), |s, t, w| {
        c_result(s.seek(t, w[1] as i64, w[2]).into())
    })
}

/// UNGETC: C send {buf\[0\] = c, buf\[1\] = tagged}; S send buf\[0\] = c or EOF.
pub(crate) fn ungetc(req: &mut Request<'_, '_>) -> Result<()> {
    on_stream(req, 1, EOF_WORD, |s, t, w| {
        c_result(s.ungetc(t, w[0] as u32 as c_int).into())
    })
}

/// FFLUSH: C send buf\[0\] = tagged; S send buf\[0\] = 0 or EOF. Handle 0 (`fflush(NULL)`)
/// flushes every standard output and open file, as C does.
pub(crate) fn fflush(req: &mut Request<'_, '_>) -> Result<()> {
    let words = recv_words(req)?;
    let services = &super::context(req).services;
    let mut refusals = Refusals::default();
    let mut replies = [EOF_WORD; 64];
    for lane in active(req) {
        let handle = words[lane as usize][0];
        let result = if handle == 0 {
            Some(services.flush_all())
        } else {
            services.tagged(handle).map(|t| services.flush(&t))
        };
        match result {
            Some(result) => replies[lane as usize] = c_result(result.into()),
            None => refusals.lane(
                lane,
                std::format!("{handle:#x} is not a live stream handle"),
            ),
        }
    }
    send_word0(req, &replies)?;
    refusals.finish()
}

/// CLEARERR: C send buf\[0\] = tagged; S clears; S sends the buffer back unchanged.
pub(crate) fn clearerr(req: &mut Request<'_, '_>) -> Result<()> {
    let words = recv_words(req)?;
    let services = &super::context(req).services;
    let mut refusals = Refusals::default();
    for lane in active(req) {
        let handle = words[lane as usize][0];
        match services.tagged(handle) {
            Some(target) => services.clear_error(&target),
            None => refusals.lane(
                lane,
                std::format!("{handle:#x} is not a live stream handle"),
            ),
        }
    }
    req.send(|_, _| {})?;
    refusals.finish()
}

/// REMOVE: C send_n(path); S send buf\[0\] = 0 or -1.
pub(crate) fn remove(req: &mut Request<'_, '_>) -> Result<()> {
    let paths = recv_streams(req)?;
    let policy = super::context(req).services.config().files;
    let mut refusals = Refusals::default();
    let mut replies = [c_result(-1); 64];
    for lane in active(req) {
        let path = match &paths[lane as usize] {
            Ok(path) => path,
            Err(len) => {
                refusals.too_long(lane, *len, bound(req));
                continue;
            }
        };
        let (host, c) = device_path(path);
        if let Err(why) = permitted(&policy, &host, false) {
            refusals.lane(lane, why);
            continue;
        }
        // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
        let result = unsafe { libc::remove(c.as_ptr()) };
        replies[lane as usize] = c_result(result.into());
    }
    send_word0(req, &replies)?;
    refusals.finish()
}

/// RENAME: C send_n(old); C send_n(new); S send buf\[0\] = 0 or -1.
pub(crate) fn rename(req: &mut Request<'_, '_>) -> Result<()> {
    let old = recv_streams(req)?;
    let new = recv_streams(req)?;
    let policy = super::context(req).services.config().files;
    let mut refusals = Refusals::default();
    let mut replies = [c_result(-1); 64];
    for lane in active(req) {
        let (old, new) = match (&old[lane as usize], &new[lane as usize]) {
            (Ok(old), Ok(new)) => (old, new),
            (Err(len), _) | (_, Err(len)) => {
                refusals.too_long(lane, *len, bound(req));
                continue;
            }
        };
        let (old_host, old_c) = device_path(old);
        let (new_host, new_c) = device_path(new);
        if let Err(why) =
            permitted(&policy, &old_host, false).and_then(|()| permitted(&policy, &new_host, false))
        {
            refusals.lane(lane, why);
            continue;
        }
        // SAFETY: both are valid NUL-terminated strings for the duration of the call.
        let result = unsafe { libc::rename(old_c.as_ptr(), new_c.as_ptr()) };
        replies[lane as usize] = c_result(result.into());
    }
    send_word0(req, &replies)?;
    refusals.finish()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        for good in [&b"r"[..], b"w", b"a+", b"rb", b"wbx", b"r+e"] {
            assert!(valid_mode(good), "{good:?}");
        }
        for bad in [&b""[..], b"x", b"q", b"r,ccs=UTF-8", b"rrrrrrrrr", b"rm"] {
            assert!(!valid_mode(bad), "{bad:?}");
        }
    }

    #[test]
    fn policy_under_a_directory() {
        let root = std::env::temp_dir().join(std::format!("rpc-policy-{}", std::process::id()));
        let inside = root.join("in");
        std::fs::create_dir_all(&inside).unwrap();
        let policy = FilePolicy::Under(root.clone());
        assert!(permitted(&policy, &inside.join("new.txt"), true).is_ok());
        assert!(permitted(&policy, &inside.join("../x"), false).is_ok());
        assert!(permitted(&policy, &inside.join("../../x"), false).is_err());
        assert!(permitted(&policy, Path::new("/etc/passwd"), true).is_err());
        assert!(permitted(&policy, &inside.join(".."), false).is_err());
        let link = inside.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
        assert!(permitted(&policy, &link, true).is_err(), "follows links");
        assert!(permitted(&policy, &link, false).is_ok(), "the link itself");
        assert!(permitted(&FilePolicy::Denied, &inside, false).is_err());
        assert!(permitted(&FilePolicy::Allowed, Path::new("/x"), true).is_ok());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
